// Package inbox is the consuming half of the outbox/inbox pattern: it reads
// events from Kafka and applies each one's side effects at most once per
// consumer, although Kafka delivers at least once.
//
// Two modes:
//
//   - NewConsumer, for side effects in the consumer's own database: the
//     Handler runs inside the transaction that records the event id in the
//     inbox table, so the effect and the dedupe record commit together.
//     NewBatchConsumer is the same with a BatchHandler, which also applies
//     a batch's new events at once (a statement for all of them instead of
//     one per event).
//   - Lease mode, for side effects outside it (an HTTP call to a third
//     party that cannot dedupe), is package lease (pkg/inbox/lease):
//     lease.NewConsumer returns the same Consumer, with the same
//     dispatcher, dedupe, version guard, dead letters and offsets; only the
//     applier differs. A program that does not import it compiles none of
//     it.
//
// This package is the front door: what an adopter calls, and nothing else.
// The engine behind it is pkg/inbox/internal/engine (most names here are
// aliases of its types or thin calls of its functions, and their fields and
// methods are documented there), one stage of a message per file. The
// Consumer is the dispatcher, consume.go: Run, the key → worker routing,
// batching, Handle and the Applier interface it hands each batch to, over
// the consumer group, its partition readers and offset commits, what may
// be committed, and what comes with each message (its generation, which an
// applier may only finish or ask whether it was dropped); release.go
// releases parked messages through the applier and lag.go keeps the backlog
// gauges. NewConsumer (or lease.NewConsumer, through the engine's
// NewApplied) picks the applier once, and the appliers never call back
// into the dispatcher: what they need is built once and handed to them
// (apply.go's Shared: the pool, the settings, the outages, the dead-letter
// writer). The transactional applier, TxApplier, is apply.go: inbox row,
// version guard and handler in one transaction, a whole batch set-based
// first, then a savepoint per message with retries; the lease applier is
// pkg/inbox/lease's. Both settle through settle.go (the version guard,
// upcasters and payload checks; per-key parking behind a dead event),
// deadletter.go, errors.go (the error classes), health.go (outages) and
// observe.go (spans and metrics); the dead letter's headers, the form kept
// headers are stored in and the reading of a dead-letter topic are
// internal/dlt's. Pruning is prune.go. The operator's side (listing,
// requeuing, releasing or skipping, the backlog, an aggregate's rows) is
// package inboxadmin (pkg/inbox/inboxadmin), which a service that only
// consumes does not need. Every write of the inbox's lifecycle tables, lease
// mode's included, is a transition of internal/state's state.go, the machine
// written down once (docs/inbox.md draws it); the reads sit with the job
// they serve (parking's in settle.go, the lease applier's in pkg/inbox/lease).
//
// Consumer groups: a Consumer is one member of the Kafka consumer group in
// its GroupConfig (kafka-go's consumer-group API). For every generation the
// group hands it, it reads each assigned partition with a partition reader
// from the assigned offset, and tracks every fetched message by (topic,
// partition, offset) within that generation. Offsets are committed every
// CommitInterval with the generation's id, so a member that lost a
// partition cannot move that partition's offset back after its new owner
// went further: the coordinator refuses commits of an older generation.
// When a generation ends (a rebalance, or Run's ctx), no new work starts
// under it, the work in hand gets a bounded time (half the rebalance
// timeout, or ShutdownGrace) to finish, the finished offsets are committed
// and the generation's tracking is dropped. Work still in hand after that is
// abandoned uncommitted: the next owner fetches it again and the inbox
// absorbs it if it did commit after all.
//
// Error classes: a worker waits out outages and charges only the message's
// own failures to the message.
//   - Outages: Kafka unreachable or not ready (dial errors, connection
//     resets, NotLeaderForPartition, LeaderNotAvailable, RequestTimedOut,
//     NotEnoughReplicas, a group coordinator moving); the database
//     unreachable (pgerr.IsUnavailable: SQLSTATE class 08, 57P01-57P03,
//     class 53, a broken connection, a pool acquire timeout). Retried with
//     capped backoff and jitter for as long as they last, never counted as
//     an attempt of a message, never a dead letter. They are counted
//     (inbox_kafka_errors_total, inbox_database_errors_total by op), shown
//     (inbox_kafka_connected, inbox_database_connected, Consumer.Healthy for
//     /readyz) and logged at a bounded rate (ErrorLogInterval).
//   - Permanent message errors: undecodable or invalid envelopes
//     (event.ErrInvalid, which includes NUL bytes, invalid UTF-8, over-long
//     fields and absurd versions), errors wrapping ErrPermanent, and data
//     Postgres refuses (pgerr.IsPermanent: SQLSTATE class 22, such as 22021
//     for a NUL in a text column, and class 54). Dead-lettered at once.
//   - Other handler or commit errors: retried with backoff up to
//     MaxAttempts, then dead-lettered.
//
// A dead letter the dead-letter topic refuses as it is (an error about the
// message: too large, a policy) is written truncated: coordinates,
// reason and the value's first 64 KiB, with inboxadmin.HeaderDLTTruncated.
// A dead letter is published with no transaction open: the batch-mates
// before it commit first, then it is published (waiting out a Kafka outage
// without holding row locks or a connection), then its inbox row commits in
// a short transaction of its own, and only then is its offset committed. A
// crash in between redelivers it and dead-letters it again: a duplicate
// dead letter is possible after a crash, a missing one is not.
// Run returns only once its ctx ended (or a crash point fired); every retry
// loop ends within ShutdownGrace of that.
//
// Guarantees:
//   - A redelivered event finds its inbox row and is acknowledged without
//     running the handler; it is counted (inbox_duplicates_total).
//   - The Kafka offset is committed only after the database commit, and a
//     partition's offset never passes a message still being handled, nor
//     is it committed under a generation that no longer owns the partition.
//     A crash in between redelivers events the inbox absorbs.
//   - Events of one key (one aggregate) are handled in order: Workers run in
//     parallel, but each key always goes to the same worker. With the version
//     guard on (the default), an event at or below the aggregate version this
//     consumer already applied (another event id) is dead-lettered with its
//     reason, holding nothing back (Config.SkipStale skips it, counted, as
//     an opt-in); a jump of more than one is a gap: by default the event
//     waits a bounded time (MaxAttempts retries), then is dead-lettered and
//     its successors park behind it; Config.AcceptGaps applies it at once,
//     reported, as an opt-in. The lifecycle of every
//     inbox row, with who may move it, is internal/state's state.go (docs/inbox.md draws it).
//   - Throughput: a worker handles up to BatchSize messages in one
//     transaction. It first tries the whole batch with set-based inbox work
//     (one INSERT for every message's inbox row, one read and one upsert for
//     the version guard) and the handlers without savepoints: about two round
//     trips per message besides the handler's own. If anything in the batch
//     fails, that transaction is rolled back and the batch is handled again
//     with a savepoint per message, so one bad message does not undo the
//     others; a transiently failing one is retried alone with backoff. A
//     handler must therefore expect to run again after a rollback, as it
//     always must in a transaction.
//   - Nothing is dropped silently and nothing retries forever: an
//     undecodable message, an invalid or unknown-version event (an error
//     wrapping ErrPermanent or event.ErrInvalid), or one still failing after
//     MaxAttempts goes to the dead-letter topic (<topic>.dlt) with the
//     reason and its original coordinates as headers
//     (inboxadmin.HeaderDLTReason, …), a 'dead_lettered' inbox row records
//     it, and the partition moves on.
//   - While an event of an aggregate is dead (dead-lettered, not yet
//     requeued and applied), the aggregate's later events are parked in
//     inbox_parked_messages instead of applied, counted
//     (inbox_parked_messages) and listed (inboxadmin.ListParked,
//     inboxadmin.Backlog); the partition moves on for every other
//     aggregate. A requeue of the dead event
//     (inboxadmin.RequeueDeadLetters) makes it apply, whatever the version
//     guard says, and then releases the parked events in the order they
//     arrived (internal/engine/settle.go). Config.SkipAheadOfDead applies
//     them at once instead, for consumers whose events of one aggregate are
//     independent.
//   - Old payload versions are converted by registered Upcasters, so a
//     handler only ever sees the current version.
//
// Latency: a partition's fetch answers as soon as a message is in the log
// (GroupConfig.MinBytes 1), however long MaxWait is, and the worker takes
// what is queued without waiting for a batch to fill, so one event at a low
// rate reaches its handler a few milliseconds after the broker has it.
// inbox_hop_seconds measures each event from its occurredAt to its
// handler's start.
//
// Tracing: the handler runs in an OpenTelemetry consumer span (in lease
// mode the span covers the side effect and marking it done) that
// continues the trace context of the message's traceparent header, and its
// ctx carries the span: an event the handler enqueues stores it
// (event.TraceparentFromContext), an HTTP call whose transport injects it
// (the platform's tracing.Transport, or otelhttp) sends it.
// Spans go to the process-wide tracer provider (package tracing); without one
// they cost next to nothing and hand the header's context on unchanged.
//
// Configuration follows one convention across the package. A zero field
// takes the default its doc comment states in numbers (Workers 4,
// GroupConfig.SessionTimeout 10s, PruneConfig.Retention 30 days, lease
// mode's LeaseTTL 30s, …), or a fraction of another field where the doc
// says so (lease mode's CallTimeout is LeaseTTL/3); WithDefaults returns a
// config with them filled in, to read or log. A negative one is an error, never quietly the
// default. Validate reports it, and combinations no consumer can run with
// (a lease whose LeaseTTL does not outlast CallTimeout + LeaseMargin); WithDefaults
// fills the zeros and keeps the negatives for Validate; the constructors and
// functions call both. Config holds the knobs of every consumer,
// lease.Config adds those only lease mode has, GroupConfig those of the
// consumer group, PruneConfig and PrunerConfig those of pruning; the limits
// of inboxadmin's listings and requeues and its BacklogConfig's ages follow
// the same rule. Metrics are
// documented on NewMetrics.
// Two crash points (after the database commit, before the offset commit;
// after a leased side effect, before marking it done) let a fault-injection
// harness kill a consumer at the worst moments; they are armed only through
// the test kit (inboxtest.WithCrashPoint), never in a config.
//
// The schema ships as golang-migrate files in Migrations; apply them with
// the service's own migrations, tracked in MigrationsTable.
//
// Tests of handlers use the test kit in inboxtest: Deliver runs a handler
// through Consumer.Handle, the consumer's real transaction path, without
// Kafka, and RequireProcessed asserts what the inbox recorded.
package inbox
