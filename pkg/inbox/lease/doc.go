// Package lease is the inbox's lease mode, for side effects outside the
// consumer's database (an HTTP call to a third party that cannot dedupe).
// NewConsumer returns an inbox.Consumer whose applier runs an Effect for
// each event: the message is leased to one worker with a fencing token, the
// call carries the event id as its idempotency key, and a delivery whose
// predecessor may have called first asks the other side (Effect.Check)
// whether it has the key; when it cannot tell, the message is marked
// 'uncertain' for reconciliation instead of repeated. A worker leases a
// batch of messages in one transaction, calls out for distinct keys
// concurrently (Config.MaxInFlight calls at most across the consumer) while
// each key's messages go one after the other, and marks the called ones
// done in one transaction. Everything else — the consumer group, offsets,
// dedupe, the version guard, parking, dead letters, the operator's verbs,
// metrics — is pkg/inbox's, and its engine (pkg/inbox/internal/engine) is
// shared: this package holds only the lease applier.
//
// Lease mode acts only under a lease it holds. Each Effect.Check and
// Effect.Call takes a call slot, then renews its lease under the fencing
// token, and only then starts, with a ctx that ends CallTimeout after that
// renewal began (a call that starts within a tenth of CallTimeout of the
// batch's lease transaction counts that transaction as its renewal, and
// runs without another); the lease runs LeaseTTL from no earlier, and
// Config.Validate insists on LeaseTTL > CallTimeout + LeaseMargin. So
// every call's ctx ends at least LeaseMargin before its lease can expire,
// and a worker that takes over an expired lease (which the claim's SQL
// allows only once the lease has expired, by the database's clock) checks
// the other side only after the previous holder's last possible call has
// ended and had LeaseMargin to land. A renewal that finds the token changed
// means another worker took the message over: this worker drops the
// message at once, and the
// later messages of its key in its hands with it (they are redelivered,
// after it). A call that failed may still land: the worker checks, before
// calling again, no sooner than LeaseMargin after it. The other side being
// unreachable (an error wrapping ErrUnavailable, or a call cut off by
// CallTimeout) is an outage like the database's: waited out with capped
// backoff, counted (inbox_effect_errors_total), shown
// (inbox_effect_connected, Healthy), never an attempt of the message.
//
// The window that remains: a process frozen (SIGSTOP, a VM pause, a very
// long GC pause) after the last moment its call looks at its ctx and before
// the call's first byte leaves. Frozen longer than the time left on its
// lease, it may wake up and send a call that a new holder has already
// checked for and made. An HTTP client looks at the ctx when it connects
// and writes, so the window is that of a freeze between those steps and the
// bytes leaving the process; everything before it (waiting for a slot,
// renewing, checking) is covered by the fencing token and the deadline. The
// settings bound it: a freeze shorter than LeaseTTL - CallTimeout (the time
// left on the lease when the ctx ends), and a call that lands no later than
// LeaseMargin after its ctx ended, cannot cause a second call. Choose
// CallTimeout from the other side's real latency, LeaseMargin from how long
// it may go on processing a request its caller gave up on, and LeaseTTL
// above their sum by the longest freeze worth surviving; the reconciliation
// report (the other side's records against the inbox) finds what is left.
//
// The files, one job each: lease.go (the applier, its reads), consumer.go
// (NewConsumer), config.go (Config), effect.go (the contract: Effect,
// Outcome, ErrUnavailable, ErrUnknowable), lease_claim.go (leasing a
// batch), lease_batch.go (each key's turn, marking done), lease_call.go (a
// call under the lease), lease_settle.go (closing a lease on its own),
// lease_alone.go (one message in transactions of its own, when a batch
// cannot lease it) and lease_server.go (checking first after a database
// failover). Its writes of the inbox's tables are transitions of the
// engine's state.go, each naming the fencing token it expects.
package lease
