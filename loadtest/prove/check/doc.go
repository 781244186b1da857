// Package check is the nemesis's checker: it reads a history (JSON lines,
// one Record each) of what clients saw and what the databases, the topics
// and the third party's ledger held afterwards, and tests the platform's
// invariants over the whole of it: atomicity, no loss, no duplicate
// effect, per-key order, liveness.
//
// It shares no code with the libraries it judges (it imports nothing from
// pkg/outbox or pkg/inbox, nor the event envelope): a checker that reused
// their notion of "applied" or "stale" would inherit their bugs. Everything
// it knows comes from the history file, so a saved run can be checked again
// later, by this package (`go run ./loadtest/prove/check/cmd/recheck`) or
// by any other checker.
package check
