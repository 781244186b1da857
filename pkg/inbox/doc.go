// Package inbox is the consuming half of the outbox/inbox pattern: it reads
// events from Kafka and applies each one's side effects at most once per
// consumer, although Kafka delivers at least once.
//
// Two modes:
//
//   - NewConsumer, for side effects in the consumer's own database: the
//     Handler runs inside the transaction that records the event id in the
//     inbox table, so the effect and the dedupe record commit together.
//   - NewLeaseConsumer, for side effects outside it (an HTTP call to a third
//     party that cannot dedupe): the message is leased to one worker with a
//     fencing token, the call carries the event id as its idempotency key,
//     and a delivery whose predecessor may have called first asks the other
//     side (Effect.Check) whether it has the key; when it cannot tell, the
//     message is marked 'uncertain' for reconciliation instead of repeated.
//
// Guarantees:
//   - A redelivered event finds its inbox row and is acknowledged without
//     running the handler; it is counted (inbox_duplicates_total).
//   - The Kafka offset is committed only after the database commit, and a
//     partition's offset never passes a message still being handled. A
//     crash in between redelivers events the inbox absorbs.
//   - Events of one key (one aggregate) are handled in order: Workers run in
//     parallel, but each key always goes to the same worker. With the version
//     guard on (the default), an event at or below the aggregate version this
//     consumer already applied is skipped as stale and counted; a jump of
//     more than one is a gap, reported, and handled or waited for as the
//     GapPolicy says.
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
//     MaxAttempts goes to the dead-letter topic (<topic>.dlt) with the reason
//     and its original coordinates as headers, a 'dead_lettered' inbox row
//     records it, and the partition moves on.
//   - Old payload versions are converted by registered Upcasters, so a
//     handler only ever sees the current version.
//
// Knobs and their defaults are documented on Config; metrics on NewMetrics.
// The crash points CrashAfterCommit and CrashAfterEffect let a
// fault-injection harness kill a consumer at the worst moments.
//
// The schema ships as golang-migrate files in Migrations; apply them with
// the service's own migrations, tracked in MigrationsTable.
package inbox
