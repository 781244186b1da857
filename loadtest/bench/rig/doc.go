// Package rig runs the whole platform as real processes for load tests: it
// builds the four programs, gives them fresh databases and topics of their
// own, starts them in order on port 0 through pkg/platform/harness (which
// reads the addresses they bind; PrePickPorts for older binaries), warms the pipeline,
// runs k6 scripts against them, and takes everything down again.
//
// `make bench` (loadtest/bench/cmd/bench) and the k6 smoke test (smoke_test.go,
// part of `make test`) use it. It needs the dev stack (`make up`) and, for
// k6, the project's own build (`make k6`).
package rig
