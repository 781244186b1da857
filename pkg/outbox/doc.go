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
//   - Order: one relay per database publishes rows in commit-insertion (id)
//     order, keyed by aggregate id, so each aggregate's events land on one
//     Kafka partition in order. Running several relays on one database
//     today trades that order away (rows are claimed with SKIP LOCKED).
//   - Bounded retries: a failed publish is retried with exponential backoff
//     and jitter; after MaxAttempts the row is marked dead, counted and
//     logged, and never retried silently.
//
// The schema ships as golang-migrate files in Migrations; apply them with
// the service's own migrations, tracked in MigrationsTable.
package outbox
