//go:build unix

package outbox_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// ---------------------------------------------------------------------------
// The log-based relay (cdc.Relay): write cost and drain rate.
// ---------------------------------------------------------------------------

// BenchmarkCDCWriteOverhead is BenchmarkEnqueueOverhead for the log-based
// modes: the same order insert alone and with its event, alternating in
// short rounds, 8 workers. mode=table writes the event with Enqueue (the
// row the slot streams; the write is the polling mode's, and what changes
// is that the relay never updates it), mode=wal with Emit (no row). It
// reports the rates, their ratio (issue 15's goals: wal ≥ 0.95, table
// ≥ 0.75) and the WAL each event adds. WAL positions are cluster-wide, so
// other databases' writes during the run inflate wal-bytes/event.
func BenchmarkCDCWriteOverhead(b *testing.B) {
	// mode=poll is the polling relay's write (Enqueue, as mode=table), measured
	// here too so make bench compares all three in one run, WAL included.
	for _, mode := range []outbox.RelayMode{outbox.ModePoll, outbox.ModeCDC, outbox.ModeWAL} {
		name := "mode=" + string(mode)
		if mode == outbox.ModeCDC {
			name = "mode=table"
		}
		b.Run(name, func(b *testing.B) { benchCDCWriteOverhead(b, mode) })
	}
}

func benchCDCWriteOverhead(b *testing.B, mode outbox.RelayMode) {
	const workers = 8
	ctx := context.Background()
	write := cdc.Write(mode)
	pool := benchPool(b, testenv.NewDatabase(b), workers+1, "on", nil)
	benchMigrate(b, pool)
	if mode == outbox.ModeWAL {
		// Emit refuses to write while no logical slot holds the database's
		// WAL (cdc.ErrNoSlot: the event would be decoded by no one), as in
		// life, where the relay's slot exists before the service takes
		// writes; nothing reads this one during the benchmark.
		// Recorded as the relay's: another tool's slot does not satisfy Emit.
		slot := newSlot(b, pool)
		if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
			b.Fatalf("creating the slot Emit needs: %v", err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO outbox_cdc_slots (slot_name, confirmed_lsn)
			SELECT slot_name, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1`, slot); err != nil {
			b.Fatalf("recording the slot Emit needs: %v", err)
		}
	}
	if _, err := pool.Exec(ctx, createBenchOrders); err != nil {
		b.Fatalf("creating bench_orders: %v", err)
	}
	bare := func(ctx context.Context, n int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insertBenchOrder, event.NewID(), "customer", 1000+n%5000)
			return err
		})
	}
	withEvent := func(ctx context.Context, n int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id := event.NewID()
			if _, err := tx.Exec(ctx, insertBenchOrder, id, "customer", 1000+n%5000); err != nil {
				return err
			}
			return write(ctx, tx, benchOrderPlaced(id.String(), 1, n))
		})
	}
	bareRes, eventRes := benchAB(b, pool, workers, true, bare, withEvent)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(bareRes.rate(), "bare-tx/s")
	b.ReportMetric(eventRes.rate(), "event-tx/s")
	b.ReportMetric(eventRes.rate()/bareRes.rate(), "ratio")
	b.ReportMetric(benchMillis(benchPercentile(eventRes.latencies, 0.99)), "event-p99-ms")
	b.ReportMetric(float64(eventRes.walBytes)/float64(eventRes.count)-float64(bareRes.walBytes)/float64(bareRes.count), "wal-bytes/event")
}

// BenchmarkCDCDrain is BenchmarkRelayDrain for the log-based relay: a
// backlog of drainBacklog (100,000) events committed in transactions of 100 while the slot
// existed and no relay ran, then drained by a cdc.Relay, against kafka-go
// producing the same messages directly (goal: ratio ≥ 0.50).
//
// mode=poll is BenchmarkRelayDrain/batch=1000 (the polling relay), so one
// -bench run gives the three modes' drains side by side.
func BenchmarkCDCDrain(b *testing.B) {
	b.Run("mode=poll", func(b *testing.B) {
		brokers := testenv.KafkaBrokers(b)
		dbURL := testenv.NewDatabase(b)
		pool := benchPool(b, dbURL, 4, "on", nil)
		benchMigrate(b, pool)
		phases := newBenchPhases()
		relayPool := benchPool(b, dbURL, 4, "on", phases)
		benchRelayDrain(b, brokers, pool, relayPool, phases, 1000, func() *testenv.Writer { return testenv.NewWriter(brokers, 1000) })
	})
	for _, mode := range []string{"table", "wal"} {
		b.Run("mode="+mode, func(b *testing.B) { benchCDCDrain(b, mode) })
	}
}

// inChunksOf100 is a DO block that runs stmt, which reads the rows of
// table with lo <= id < lo + 100, once per 100 ids in id order, committing
// after each, so the slot sees many commits, as in life.
func inChunksOf100(table, stmt string) string {
	return `
DO $$
DECLARE lo bigint; hi bigint;
BEGIN
  SELECT min(id), max(id) INTO lo, hi FROM ` + table + `;
  WHILE lo <= hi LOOP
    ` + stmt + `;
    COMMIT;
    lo := lo + 100;
  END LOOP;
END $$`
}

// emitFromTable re-emits the rows of outbox_events as Emit's messages, 100
// rows per transaction, in id order.
var emitFromTable = inChunksOf100("outbox_events", `PERFORM pg_logical_emit_message(true, '`+cdc.EmitPrefix+`', `+emittedSQL("event_id", "event_type",
	"event_version", "aggregate_type", "aggregate_id", "aggregate_version", "occurred_at", "headers->>'correlationId'",
	"''", "headers->>'traceparent'", "payload")+`)
    FROM outbox_events WHERE id >= lo AND id < lo + 100 ORDER BY id`)

// copyInChunks re-inserts a filled backlog (moved aside to bench_backlog)
// 100 rows per transaction.
var copyInChunks = inChunksOf100("bench_backlog", `INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
        event_version, payload, headers, occurred_at, partition)
    SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
           payload, headers, occurred_at, partition
    FROM bench_backlog WHERE id >= lo AND id < lo + 100 ORDER BY id`)

func benchCDCDrain(b *testing.B, mode string) {
	ctx := context.Background()
	brokers := testenv.KafkaBrokers(b)
	pool := benchPool(b, testenv.NewDatabase(b), 4, "on", nil)
	benchMigrate(b, pool)
	var raw, relayed benchRate
	for range b.N {
		rawTopic := testenv.NewTopic(b, brokers, 6)
		relayTopic := testenv.NewTopic(b, brokers, 6)
		slot := newSlot(b, pool)
		for _, q := range []string{"TRUNCATE outbox_events", "DROP TABLE IF EXISTS bench_backlog"} {
			if _, err := pool.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, fillBacklog, drainBacklog, outbox.Partitions); err != nil {
			b.Fatalf("filling the backlog: %v", err)
		}
		msgs := benchBacklogMessages(b, pool, rawTopic)
		// The slot first, then the commits it is to stream. It is recorded
		// as one the relay made and streamed: a slot made by hand has its
		// gap replayed from the table before the stream starts (the table
		// mode's drain measured that replay, not the stream).
		if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
			b.Fatalf("creating the slot: %v", err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO outbox_cdc_slots (slot_name, confirmed_lsn)
			SELECT slot_name, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1`, slot); err != nil {
			b.Fatalf("recording the slot: %v", err)
		}
		fill := emitFromTable
		if mode == "table" {
			if _, err := pool.Exec(ctx, "CREATE TABLE bench_backlog AS SELECT * FROM outbox_events; TRUNCATE outbox_events"); err != nil {
				b.Fatal(err)
			}
			fill = copyInChunks
		}
		if _, err := pool.Exec(ctx, fill); err != nil {
			b.Fatalf("committing the backlog: %v", err)
		}
		if mode == "wal" {
			if _, err := pool.Exec(ctx, "TRUNCATE outbox_events"); err != nil {
				b.Fatal(err)
			}
		}

		w := testenv.NewWriter(brokers, 1000)
		benchProduceRaw(b, w, msgs, 1000, &raw)
		benchCloseWriter(w)

		w = testenv.NewWriter(brokers, 1000)
		counted := &benchCountingWriter{w: w, done: make(chan struct{}), want: int64(len(msgs))}
		relay, err := cdc.NewRelay(pool, counted, cdc.Config{Slot: slot, BatchSize: 1000,
			Topic: func(string) string { return relayTopic }, Logger: benchLogger, RetentionInterval: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		ran := make(chan error, 1)
		start := time.Now()
		go func() { ran <- relay.Run(runCtx) }()
		select {
		case <-counted.done:
		case <-time.After(10 * time.Minute):
			b.Fatalf("drained %d of %d events in 10 minutes", counted.n.Load(), len(msgs))
		}
		relayed.Add(len(msgs), time.Since(start))
		stop()
		<-ran
		benchCloseWriter(w)
		if got := benchTopicMessages(b, brokers, relayTopic); got < drainBacklog {
			b.Fatalf("the relay's topic holds %d messages, want %d", got, drainBacklog)
		}
	}
	benchReportDrain(b, relayed, raw)
}

// benchCountingWriter closes done once want messages were acknowledged.
type benchCountingWriter struct {
	w    outbox.Writer
	n    atomic.Int64
	want int64
	done chan struct{}
	once atomic.Bool
}

func (c *benchCountingWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if err := c.w.WriteMessages(ctx, msgs...); err != nil {
		return err
	}
	if c.n.Add(int64(len(msgs))) >= c.want && c.once.CompareAndSwap(false, true) {
		close(c.done)
	}
	return nil
}

// BenchmarkCDCPublishLag is BenchmarkPublishLag for the log-based relay:
// one event per transaction at 1,000 commits/s (Enqueue for mode=table,
// Emit for mode=wal), timed from each Commit's return to Kafka's ack of the
// event, and to its arrival at a consumer (issue 15's goal: ack p99
// ≤ 5 ms). The relay streams the slot; nothing polls. mode=poll is
// BenchmarkPublishLag/rate=1000, so one -bench run compares the three.
func BenchmarkCDCPublishLag(b *testing.B) {
	b.Run("mode=poll", func(b *testing.B) { benchPublishLag(b, 1000, 0, "on") })
	for _, mode := range []outbox.RelayMode{outbox.ModeCDC, outbox.ModeWAL} {
		name := "mode=table"
		if mode == outbox.ModeWAL {
			name = "mode=wal"
		}
		b.Run(name, func(b *testing.B) { benchCDCPublishLag(b, cdc.Write(mode), 1000) })
	}
}

func benchCDCPublishLag(b *testing.B, write cdc.WriteFunc, rate int) {
	ctx := context.Background()
	brokers := testenv.KafkaBrokers(b)
	topic := testenv.NewTopic(b, brokers, 6)
	pool := benchPool(b, testenv.NewDatabase(b), lagProducers+2, "on", nil)
	benchMigrate(b, pool)
	slot := newSlot(b, pool)

	acked := newBenchClock()
	w := testenv.NewWriter(brokers, 500)
	defer benchCloseWriter(w)
	aw := &benchAckWriter{benchTimedWriter: benchTimedWriter{w: w, phases: newBenchPhases()}, acked: acked}
	relay, err := cdc.NewRelay(pool, aw, cdc.Config{Slot: slot,
		Topic: func(string) string { return topic }, Logger: benchLogger})
	if err != nil {
		b.Fatal(err)
	}
	defer testenv.RunInBackground(b, "relay.Run", relay.Run)()

	var (
		ackLag, consumeLag []time.Duration
		events             benchRate
		walBytes           int64
	)
	for range b.N {
		arrived := newBenchClock()
		stopConsumers := benchConsume(b, brokers, topic, 6, arrived)
		// Warm up: the relay takes its slot (events committed before it
		// exists are never streamed), the writer its metadata, the
		// consumers their first fetch. Streaming, not only active in
		// pg_replication_slots: a slot is active while it is being created
		// too, and on a busy server its creation waits for the transactions
		// running then, the warm-up's among them, which it never streams.
		testenv.WaitFor(b, 60*time.Second, "the relay to stream its slot", func() (bool, error) { return relay.Active(), nil })
		warm, err := benchTrickle(ctx, pool, write, rate, int(lagWarmUp.Seconds()*float64(rate)), newBenchClock())
		if err != nil {
			b.Fatal(err)
		}
		testenv.WaitFor(b, 30*time.Second, "the warm-up events to be acked and consumed", func() (bool, error) {
			return acked.HasAll(warm) && arrived.HasAll(warm), nil
		})

		committed := newBenchClock()
		before := benchWALPosition(b, pool)
		start := time.Now()
		ids, err := benchTrickle(ctx, pool, write, rate, int(lagLoad.Seconds()*float64(rate)), committed)
		if err != nil {
			b.Fatal(err)
		}
		events.Add(len(ids), time.Since(start))
		walBytes += benchWALSince(b, pool, before)
		testenv.WaitFor(b, 30*time.Second, "every event to be acked and consumed", func() (bool, error) {
			return acked.HasAll(ids) && arrived.HasAll(ids), nil
		})
		ackLag = append(ackLag, committed.LagsUntil(acked, ids)...)
		consumeLag = append(consumeLag, committed.LagsUntil(arrived, ids)...)
		stopConsumers()
	}
	benchReportLag(b, events, ackLag, consumeLag)
	b.ReportMetric(float64(walBytes)/float64(events.Events), "wal-bytes/event")
}

// emittedSQL is the content Emit writes (its binary encoding, internal/wal), as
// an SQL expression over the envelope's fields, so that a benchmark emits
// many events in one statement. Each argument is an SQL expression.
func emittedSQL(eventID, eventType, eventVersion, aggType, aggID, aggVersion, occurredAt, corr, cause, trace, payload string) string {
	text := func(expr string) string {
		return "int4send(octet_length(coalesce(" + expr + ", ''))) || convert_to(coalesce(" + expr + ", ''), 'UTF8')"
	}
	micros := func(expr string) string { return "int8send((extract(epoch FROM " + expr + ") * 1000000)::bigint)" }
	return strings.Join([]string{
		`'\x02'::bytea`, "uuid_send(" + eventID + ")", "int4send(" + eventVersion + ")", "int8send(" + aggVersion + ")",
		micros(occurredAt), text(eventType), text(aggType), text(aggID), text(corr), text(cause), text(trace),
		micros("clock_timestamp()"), "convert_to((" + payload + ")::jsonb::text, 'UTF8')",
	}, " || ")
}

// newSlot names a replication slot for this test (slot names are global to
// the cluster) and drops it when the test ends, after the relays using it
// stopped (cleanups run last-registered first, so call it before starting
// them): a database with a slot cannot be dropped.
func newSlot(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	slot := testenv.Name("slot")
	t.Cleanup(func() {
		testenv.WaitFor(t, 20*time.Second, "the slot to be dropped", func() (bool, error) {
			_, err := pool.Exec(context.Background(),
				`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
			return err == nil, nil // 55006 while the walsender is still going away
		})
	})
	return slot
}
