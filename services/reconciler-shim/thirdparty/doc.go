// Package thirdparty is the stand-in for the third-party reconciler that the
// reconciler-shim forwards payment settlements to.
//
// The real third party is not idempotent and cannot be changed: every
// POST /settlements it receives is booked, even one that repeats an
// Idempotency-Key it has already seen. This stand-in behaves the same way on
// purpose, and records every settlement in an append-only Ledger, so that the
// demo, the tests and the fault-injection harness can audit afterwards whether
// the shim delivered each payment exactly once (Stats.Duplicates == 0).
// A booking is answered only once its line is fsynced, so the audit counts
// every settlement the shim was told about, across a kill -9; concurrent
// bookings share one fsync (group commit), as a real ledger's would.
//
// The package holds both sides of the wire:
//
//   - NewServer serves the third party's HTTP API over a Ledger, and on a
//     separate operator listener its /metrics and a small, bounded fault
//     injection (/admin/faults, behind the bearer token) for retry tests:
//     fail the next N settlements, or answer the next N late after booking
//     them (N ≤ MaxFaultCount, at most MaxHangFor late).
//   - Client is what the shim uses to call it: Settle books a settlement,
//     Lookup asks whether a key was already booked, and errors wrapping
//     ErrRejected mark answers that retrying cannot fix; WithAdmin gives it
//     the operator URL and token SetFaults needs.
//
// The stand-in runs as its own process, cmd/reconciler.
package thirdparty
