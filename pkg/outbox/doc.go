// Package outbox is the producing half of the outbox/inbox pattern: write an
// event in the same Postgres transaction as the domain change it describes,
// and let a Relay publish it to Kafka afterwards.
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO orders …"); err != nil {
//			return err
//		}
//		return outbox.Enqueue(ctx, tx, event.Envelope{…})
//	})
//
// Guarantees:
//   - Atomicity: the event commits if and only if the transaction commits.
//     Enqueue never commits and never talks to Kafka.
//   - No loss: the relay marks a row published only after the broker
//     acknowledged it (acks=all). A crash in between republishes the row on
//     restart, so consumers see duplicates, never gaps; package inbox absorbs
//     them by event id.
//   - Order, per aggregate, across any number of relays: rows carry a
//     logical partition (a hash of the aggregate id, one of Partitions);
//     each partition is owned by one live relay at a time (a session advisory
//     lock), relays rebalance the partitions as they join, leave or die, and
//     claim rows in id order with FOR UPDATE, so a relay taking over waits
//     for a batch still in flight rather than overtaking it. A row that fails
//     holds back the later rows of its aggregate until it is published, or,
//     if it went dead, until it is requeued. The Kafka key is the aggregate
//     id, so the aggregate's events share a Kafka partition in that order.
//     What is ordered: the events of one aggregate, in the order their
//     transactions inserted them (id order), which is version order as long
//     as the business transaction locks the aggregate's row while it writes
//     the event, as any optimistic or pessimistic version check does. What
//     is not: events of different aggregates, relative to each other; and a
//     redelivery after a crash repeats events the consumer saw already
//     (dedupe by event id, as package inbox does).
//   - Bounded retries: a failed publish is retried with exponential backoff
//     and jitter; after MaxAttempts the row is marked dead, counted and
//     logged, and never retried silently.
//
// Latency without busy polling: a relay claims batch after batch while there
// is work. When a claim finds nothing it arms a wake-up (outbox_relays.waiting)
// and sleeps on LISTEN; writers' commits NOTIFY only while some relay is
// armed, because NOTIFY serializes commits cluster-wide (migration 0004
// explains the fence that keeps a commit from slipping past an arming relay).
// PollInterval is only the fallback for a lost notification.
//
// Knobs and their defaults are documented on RelayConfig; metrics on
// NewMetrics. The relay's crash points (CrashAfterAck) let a fault-injection
// harness kill it at the worst moment.
//
// The schema ships as golang-migrate files in Migrations; apply them with
// the service's own migrations, tracked in MigrationsTable.
package outbox
