// Package rig runs the whole platform as real processes for load tests: it
// builds the four programs, gives them fresh databases and topics of their
// own and free ports on loopback, starts them in order, warms the pipeline,
// runs k6 scripts against them, and takes everything down again. Each
// program also gets a debug listener (DEBUG_ADDR) for CPU profiles
// (Platform.Profile), and the CPU of the programs, of the Postgres server
// and of the Kafka broker is read by pid from /proc (Platform.CPUGroups,
// FindServers).
//
// `make bench` (loadtest/bench/cmd/bench) and the k6 smoke test (smoke_test.go,
// part of `make test`) use it. It needs the dev stack (`make up`) and, for
// k6, the project's own build (`make k6`).
//
// The programs run through platform/harness: each binds port 0 and the
// rig reads the addresses it logs, so no port is picked and then taken by
// another process first; binaries of an older revision, which do not log
// them, get ports picked in advance (Config.PrePickPorts).
package rig
