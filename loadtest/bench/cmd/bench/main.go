// Command bench is `make bench`: in one invocation on one machine it runs
// the library benchmarks (write path, relay drain, billing consumption, the
// relay modes poll, cdc and wal side by side) and
// the platform under k6 (naive vs outbox at the same load, the ramp to the
// knee, a spike, a short soak), measures per-hop latency, CPU per order by
// process and relay round trips per event around each run, and writes
// BENCHMARKS.md's headline (every goal of goals.go with its same-run
// baseline, the ratio and the verdict) and detail tables, a copy of both in
// benchmarks/history, a JSON file and an SVG plot of the steady run's lag
// over time. With -base REV every k6 scenario also runs against REV's
// programs in the same invocation, alternated with the working tree's, and
// each figure gets the base's value and the ratio. With -from FILE it writes
// the page and its history again from an earlier run's JSON, running
// nothing.
//
// Usage (from the repository root, after `make up` and `make k6`):
//
//	go run ./loadtest/bench/cmd/bench [-only write,drain,consume,cdc,modes,ramp,spike,soak] [-drain-events 100000]
//	go run ./loadtest/bench/cmd/bench -only peers [-peers-rounds 2 -peers-rates 200,1000,5000 -peers-paced 20s -peers-idle 10s -peers-big 0]
//	    [-base REV [-ab-rounds N]] [-profile-dir DIR]
//	go run ./loadtest/bench/cmd/bench -from benchmarks/results.json
//
// See loadtest/README.md for every flag and what each number means.
package main

import "github.com/onceflow/onceflow/platform/lifecycle"

func main() { lifecycle.Main("bench", run) }
