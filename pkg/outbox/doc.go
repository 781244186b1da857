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
//     logical partition (a hash of the aggregate id, one of 64);
//     each partition is owned by one live relay at a time (a session advisory
//     lock), relays rebalance the partitions as they join, leave or die, and
//     every claim takes a per-partition fence lock before it claims rows in
//     id order with FOR UPDATE, so a relay taking over waits for a batch
//     still in flight, and sees what it wrote, rather than overtaking it.
//     A row that fails
//     holds back the later rows of its aggregate until it is published, or,
//     if it went dead, until it is requeued; in its own batch too, where the
//     later rows are not given to Kafka at all (a batch's events of one
//     aggregate go in one write of kafka-go's record batch size, which the
//     broker takes or refuses whole). The Kafka key is the aggregate
//     id, so the aggregate's events share a Kafka partition in that order.
//     What is ordered: the events of one aggregate, in the order their
//     transactions inserted them (id order), which is version order as long
//     as the business transaction locks the aggregate's row while it writes
//     the event, as any optimistic or pessimistic version check does. What
//     is not: events of different aggregates, relative to each other; and a
//     redelivery after a crash repeats events the consumer saw already
//     (dedupe by event id, as package inbox does).
//   - Bounded retries: a publish that failed because of the message is
//     retried with exponential backoff and jitter; after MaxAttempts the row
//     is marked dead, counted and logged, and never retried silently.
//   - Outages are waited out: Run returns only when its context ends.
//
// A prune's errors (logged by a Pruner, returned by outboxadmin.Prune) wrap
// ErrUnavailable while Postgres is unreachable, which callers test with
// errors.Is; driver errors are translated in one file (errors.go). The
// operator's side — list and requeue dead events, replay published ones,
// read the backlog and an aggregate's events, prune once — is package
// outbox/outboxadmin, which a service that only enqueues, relays and
// prunes never needs; platform/outboxhttp serves it over HTTP.
//
// Failures are classified (internal/kafkaerr.IsMessageError):
//   - About the message: too large for the writer (kafka.MessageTooLargeError)
//     or the broker (MessageSizeTooLarge, RecordListTooLarge), corrupt or
//     invalid (InvalidMessage, InvalidRecord, InvalidTimestamp), refused by
//     a topic policy (PolicyViolation), in a format the topic cannot store.
//     Writing it again gets the same answer, so each failure is an attempt of
//     that row, and MaxAttempts make it dead. Only the row the error is about
//     is charged, never its batch-mates. A row the relay cannot make into a
//     message (its headers column does not decode: its last error says
//     "outbox: undecodable row") is one too: it is never sent, and it holds
//     back its aggregate's later rows.
//   - About the broker: everything else, such as a dial error, a connection
//     reset or EOF, NotLeaderForPartition, LeaderNotAvailable,
//     RequestTimedOut, NotEnoughReplicas, UnknownTopicOrPartition (a topic
//     being created), a write past PublishTimeout. The row stays pending
//     with its attempts unchanged, deferred by its topic's outage backoff
//     (holding its aggregate back, letting other topics flow); a batch Kafka
//     took none of makes the whole relay back off (OutageBackoffMin to
//     OutageBackoffMax), and once a topic takes a write again its deferred
//     rows are due at once. However long the outage, no row goes dead
//     because of it.
//   - Postgres errors (claim, mark, heartbeat, gauges, LISTEN) are retried
//     by each loop with the same capped backoff.
//
// Outages show in metrics (outbox_kafka_connected, outbox_kafka_errors_total,
// outbox_db_errors_total, and the backlog gauges, which keep moving), and
// are logged at a bounded rate: the first failure, at most one line per
// LogInterval with a count, and the recovery.
//
// Maintenance runs beside the work: the relay's heartbeat and rebalance,
// and the backlog gauges, run on goroutines of their own next to the claim
// loop (as in River's producer), so a relay that is busy for longer than
// RelayTTL stays registered, a relay that joins gets its share at once, and
// outbox_oldest_pending_age_seconds keeps rising while a busy relay falls
// behind.
//
// Latency without busy polling: an idle relay is armed (outbox_relays.waiting)
// and sleeps on LISTEN; writers' commits NOTIFY only while some relay is
// armed, because NOTIFY serializes commits cluster-wide (migration 0004
// explains the fence that keeps a commit from slipping past an arming relay).
// At a low rate the relay stays armed, and each commit costs it one claim
// and two round trips to Postgres: one pipeline begins, fences the
// partitions and claims; after the publish, another marks and commits. Once
// its rate passes a few hundred events a second (or a claim fills
// BatchSize) it disarms, so writers stop notifying, and claims batch after
// batch, lingering up to Linger between batches that did not fill up; when
// a claim finds nothing it arms again, in the next claim's round trip.
// PollInterval is only the fallback for a lost notification and for rows
// whose retry backoff ran out. outbox_relay_claims_total and
// outbox_relay_db_roundtrips_total{op}, over outbox_published_total, are
// the relay's claims and round trips per event.
//
// Tracing: Enqueue stores the envelope's Traceparent with the row (set it
// from the producing request's span with event.TraceparentFromContext). The relay
// publishes each event in an OpenTelemetry producer span that continues that
// stored context, and the Kafka message carries the producer span's
// traceparent, so the consumer's span is its child. Spans go to the
// process-wide tracer provider (package tracing); without one they cost next
// to nothing and hand the stored context on unchanged.
//
// Knobs and their defaults are documented on RelayConfig and cdc.Config, one
// convention for both: a zero field takes the default its doc comment
// gives, WithDefaults fills them, Validate refuses negatives and
// impossible combinations, the constructors call both. Metrics are
// documented on NewMetrics. The relay's crash point (after the broker's
// acknowledgement, before marking the rows published or confirming the
// slot) lets a fault-injection harness kill it at the worst moment; it is
// armed only through the test kit (outboxtest.WithCrashPoint), never in a
// config.
//
// The log-based relay, which publishes from Postgres's logical replication
// stream instead of polling (RELAY_MODE cdc and wal), is package
// outbox/cdc, so that a service that only polls never compiles the
// replication client. The relay modes are named here (RelayMode,
// ParseRelayMode); the operator actions take the mode
// (outboxadmin.Requeue, RequeueDead and Replay), one entry point for every
// mode. cdc.Write
// and cdc.Queue pick a mode's write (cdc.Emit in ModeWAL, Enqueue
// otherwise), and cdc.NewPublisher the relay of a mode.
//
// The schema ships as golang-migrate files in Migrations; apply them with
// the service's own migrations, tracked in MigrationsTable.
//
// Tests of code that enqueues use the test kit in outboxtest
// (RequireEnqueued, an in-memory Writer) rather than SQL against the table.
package outbox
