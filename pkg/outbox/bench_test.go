//go:build unix

// The benchmarks run against the real PostgreSQL and Kafka that `make up`
// starts, on whatever machine runs them. A shared 2-core box is too noisy
// for absolute numbers to mean much, so each benchmark measures its own
// baseline in the same run and reports the RATIO (or the latency) beside the
// raw rates. Run them with `make bench-outbox`; BENCHMARKS.md explains each
// number and the goals.
//
// Every benchmark is one experiment per b.N iteration, so run them with
// -benchtime 1x; ns/op is suppressed because it would time the setup too.
// The build constraint is for getrusage, which the idle-CPU check reads.

package outbox_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// ---------------------------------------------------------------------------
// 1. What Enqueue costs a business transaction.
// ---------------------------------------------------------------------------

// BenchmarkEnqueueOverhead runs the same order insert with and without an
// outbox.Enqueue beside it, with the same number of concurrent workers,
// alternating the two variants in short rounds (A B, B A, A B, …) so that
// drift in the machine's speed falls on both alike. It reports both
// transaction rates, their ratio (goal ≥ 0.90) and p50/p99 latencies.
//
// The sub-benchmarks after the first are knobs: the worker count, and
// synchronous_commit=off on the benchmark's connections, and the relay's
// state. By default no relay waits, as while relays are busy: commits do not
// notify (migration 0004). relay=waiting registers a sleeping relay, so every
// commit notifies: the worst case, and what every commit cost before 0004.
// notify-trigger=off is a diagnosis, not a configuration anyone should run:
// it disables the trigger altogether, to show what its check costs.
func BenchmarkEnqueueOverhead(b *testing.B) {
	for _, c := range []struct {
		name       string
		workers    int
		syncCommit string
		relay      string // "" (none waiting), "waiting", "trigger-off"
	}{
		{"workers=8", 8, "on", ""},
		{"workers=1", 1, "on", ""},
		{"workers=32", 32, "on", ""},
		{"workers=8/synchronous_commit=off", 8, "off", ""},
		{"workers=8/relay=waiting", 8, "on", "waiting"},
		{"workers=8/notify-trigger=off", 8, "on", "trigger-off"},
	} {
		b.Run(c.name, func(b *testing.B) { benchEnqueueOverhead(b, c.workers, c.syncCommit, c.relay) })
	}
}

const (
	enqueueRound  = time.Second // one variant's share of a pair of rounds
	enqueuePairs  = 4           // A/B pairs per b.N iteration
	enqueueWarmUp = 300 * time.Millisecond

	createBenchOrders = `
CREATE TABLE bench_orders (
    id           uuid        PRIMARY KEY,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL,
    status       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
)`
	insertBenchOrder = `INSERT INTO bench_orders (id, customer_id, amount_cents, status) VALUES ($1, $2, $3, 'placed')`
)

func benchEnqueueOverhead(b *testing.B, workers int, syncCommit, relay string) {
	ctx := context.Background()
	pool := benchPool(b, testenv.NewDatabase(b), int32(workers)+1, syncCommit, nil) // +1: the wait sampler
	benchMigrate(b, pool)
	switch relay {
	case "trigger-off":
		if _, err := pool.Exec(ctx, "ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_notify"); err != nil {
			b.Fatal(err)
		}
	case "waiting":
		if _, err := pool.Exec(ctx, "INSERT INTO outbox_relays (id, waiting) VALUES ('bench-sleeper', true)"); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, createBenchOrders); err != nil {
		b.Fatalf("creating bench_orders: %v", err)
	}

	placeOrder := func(ctx context.Context, tx pgx.Tx, id uuid.UUID, n int) error {
		_, err := tx.Exec(ctx, insertBenchOrder, id, "customer-"+strconv.Itoa(n%977), 1000+n%5000)
		return err
	}
	bare := func(ctx context.Context, n int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return placeOrder(ctx, tx, event.NewID(), n) })
	}
	withOutbox := func(ctx context.Context, n int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id := event.NewID()
			if err := placeOrder(ctx, tx, id, n); err != nil {
				return err
			}
			return outbox.Enqueue(ctx, tx, benchOrderPlaced(id.String(), 1, n))
		})
	}

	bareRes, outboxRes := benchAB(b, pool, workers, false, bare, withOutbox)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(bareRes.rate(), "bare-tx/s")
	b.ReportMetric(outboxRes.rate(), "outbox-tx/s")
	b.ReportMetric(outboxRes.rate()/bareRes.rate(), "ratio")
	b.ReportMetric(benchMillis(benchPercentile(bareRes.latencies, 0.50)), "bare-p50-ms")
	b.ReportMetric(benchMillis(benchPercentile(bareRes.latencies, 0.99)), "bare-p99-ms")
	b.ReportMetric(benchMillis(benchPercentile(outboxRes.latencies, 0.50)), "outbox-p50-ms")
	b.ReportMetric(benchMillis(benchPercentile(outboxRes.latencies, 0.99)), "outbox-p99-ms")
	b.ReportMetric(float64(outboxRes.notifyWaits)/float64(max(1, outboxRes.active)), "outbox-notify-wait")
}

// benchABResult is what one variant's rounds in benchAB did.
type benchABResult struct {
	benchRoundResult
	walBytes int64 // the WAL written during its rounds, when measured
}

// benchAB warms up the two variants a and b (connections open, statements
// prepared, caches hot), then runs enqueuePairs×b.N pairs of enqueueRound
// rounds of each on workers goroutines, alternating the order (A B, then
// B A, …) so that drift in the machine's speed falls on both alike. With
// measureWAL it also sums the WAL each variant's rounds wrote.
func benchAB(tb *testing.B, pool *pgxpool.Pool, workers int, measureWAL bool, a, b benchTxFunc) (aRes, bRes benchABResult) {
	ctx := context.Background()
	for _, v := range []benchTxFunc{a, b} {
		if _, err := benchRound(ctx, pool, workers, enqueueWarmUp, v); err != nil {
			tb.Fatal(err)
		}
	}
	variants := []struct {
		tx  benchTxFunc
		res *benchABResult
	}{{a, &aRes}, {b, &bRes}}
	for i := range enqueuePairs * tb.N {
		for j := range variants {
			v := variants[(i+j)%2]
			var before string
			if measureWAL {
				before = benchWALPosition(tb, pool)
			}
			r, err := benchRound(ctx, pool, workers, enqueueRound, v.tx)
			if err != nil {
				tb.Fatal(err)
			}
			if measureWAL {
				v.res.walBytes += benchWALSince(tb, pool, before)
			}
			v.res.add(r)
		}
	}
	return aRes, bRes
}

// benchTxFunc runs one whole transaction; n numbers it within its worker.
type benchTxFunc func(ctx context.Context, n int) error

type benchRoundResult struct {
	count     int
	elapsed   time.Duration
	latencies []time.Duration
	// Samples of the database's active backends, and of those waiting for
	// the lock that NOTIFY takes at commit.
	active, notifyWaits int
}

func (r *benchRoundResult) add(o benchRoundResult) {
	r.count += o.count
	r.elapsed += o.elapsed
	r.latencies = append(r.latencies, o.latencies...)
	r.active += o.active
	r.notifyWaits += o.notifyWaits
}

func (r *benchRoundResult) rate() float64 { return float64(r.count) / r.elapsed.Seconds() }

// benchRound runs tx on workers goroutines, back to back, for d, while
// sampling what the backends of pool's database wait for.
func benchRound(ctx context.Context, pool *pgxpool.Pool, workers int, d time.Duration, tx benchTxFunc) (benchRoundResult, error) {
	var (
		mu       sync.Mutex
		res      benchRoundResult
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	wg.Add(1)
	go func() {
		defer wg.Done()
		active, waits, err := benchSampleWaits(ctx, pool, deadline)
		mu.Lock()
		defer mu.Unlock()
		res.active, res.notifyWaits = active, waits
		firstErr = cmp.Or(firstErr, err)
	}()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			var err error
			for n := 0; time.Now().Before(deadline); n++ {
				t0 := time.Now()
				if err = tx(ctx, n); err != nil {
					break
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			defer mu.Unlock()
			res.count += len(lat)
			res.latencies = append(res.latencies, lat...)
			firstErr = cmp.Or(firstErr, err)
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res, firstErr
}

// benchSampleWaits counts, every 20 ms until deadline, the active backends of
// pool's database and those waiting for a lock on an object. NOTIFY takes
// such a lock at commit (the pg_database object 0, for the whole cluster) and
// holds it until the commit is flushed, so commits that notify queue there
// instead of sharing one WAL flush; nothing else in this benchmark takes it.
func benchSampleWaits(ctx context.Context, pool *pgxpool.Pool, deadline time.Time) (active, waits int, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		var a, w int
		err := conn.QueryRow(ctx, `
			SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event = 'object')
			FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()`).Scan(&a, &w)
		if err != nil {
			return 0, 0, fmt.Errorf("sampling wait events: %w", err)
		}
		active, waits = active+a, waits+w
		<-tick.C
	}
	return active, waits, nil
}

// ---------------------------------------------------------------------------
// 2. How fast the relay drains a backlog.
// ---------------------------------------------------------------------------

// BenchmarkRelayDrain fills the outbox with a 100,000-event backlog, then
// times relay.RelayBatch in a loop until it is drained, beside kafka-go
// producing the very same messages from memory with the same writer settings
// and the same batches (measured before and after the drain, to bracket it).
// It reports both rates and their ratio; the goals are ≥ 20,000 events/s and
// a ratio ≥ 0.50. Beside them: the mean time per relay batch and how it
// splits into its phases (claiming and decoding the rows, writing to the
// broker, marking them published, committing), which says where it goes.
//
// RelayConfig.BatchSize is the knob of the first three sub-benchmarks; the
// others change the kafka-go writer (its BatchSize, its BatchTimeout) or the
// relay connections' synchronous_commit at BatchSize 1000.
func BenchmarkRelayDrain(b *testing.B) {
	brokers := testenv.KafkaBrokers(b)
	dbURL := testenv.NewDatabase(b)
	pool := benchPool(b, dbURL, 4, "on", nil)
	benchMigrate(b, pool)
	for _, c := range []struct {
		name          string
		batch         int
		writerBatch   int           // kafka-go Writer.BatchSize; default: batch
		writerTimeout time.Duration // kafka-go Writer.BatchTimeout; default: the writer's
		syncCommit    string
	}{
		{name: "batch=500", batch: 500},
		{name: "batch=1000", batch: 1000},
		{name: "batch=2000", batch: 2000},
		{name: "batch=1000/writer-BatchSize=100", batch: 1000, writerBatch: 100},
		{name: "batch=1000/writer-BatchTimeout=10ms", batch: 1000, writerTimeout: 10 * time.Millisecond},
		{name: "batch=1000/synchronous_commit=off", batch: 1000, syncCommit: "off"},
	} {
		b.Run(c.name, func(b *testing.B) {
			newWriter := func() *testenv.Writer {
				w := testenv.NewWriter(brokers, cmp.Or(c.writerBatch, c.batch))
				if c.writerTimeout > 0 {
					w.BatchTimeout = c.writerTimeout
				}
				return w
			}
			phases := newBenchPhases()
			relayPool := benchPool(b, dbURL, 4, cmp.Or(c.syncCommit, "on"), phases)
			benchRelayDrain(b, brokers, pool, relayPool, phases, c.batch, newWriter)
		})
	}
}

// drainBacklog is the drain benchmarks' backlog: issue 15's 100,000, or
// ONCEFLOW_BENCH_DRAIN_EVENTS (make bench's -drain-events), so a quick run
// of the wiring can use a small one.
var drainBacklog = benchDrainEvents()

func benchDrainEvents() int {
	if n, err := strconv.Atoi(os.Getenv("ONCEFLOW_BENCH_DRAIN_EVENTS")); err == nil && n > 0 {
		return n
	}
	return 100_000
}

// fillBacklog writes n pending events for n/10 orders (10,000 for issue
// 15's 100,000), ten versions each, in id order per order, computing the
// logical partition exactly as Enqueue's insertEvent does. Ten versions per
// order whatever n is, so that a larger backlog differs only in its size.
// Event ids are time-ordered, UUIDv7 as event.NewID makes them (100 events
// a millisecond): random ones would scatter every index write of the
// relay's marks over the whole event_id index, which no real outbox does.
const fillBacklog = `
INSERT INTO outbox_events (
    event_id, aggregate_type, aggregate_id, aggregate_version,
    event_type, event_version, payload, headers, occurred_at, partition)
SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint + g / 100), 12, '0') || '7' ||
        lpad(to_hex(g % 100 * 40), 3, '0') || '8' || substr(md5(random()::text), 1, 15))::uuid,
       'order', a.id, g / greatest($1 / 10, 1) + 1, 'OrderPlaced', 1,
       jsonb_build_object('orderId', a.id, 'customerId', 'customer-' || g % 977,
                          'amountCents', 1000 + g % 5000, 'currency', 'EUR'),
       jsonb_build_object('correlationId', gen_random_uuid()::text,
                          'traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'),
       now(), mod(hashtext(a.id)::bigint + 2147483648, $2)
FROM generate_series(0, $1 - 1) AS g,
     LATERAL (SELECT 'order-' || g % greatest($1 / 10, 1) AS id) AS a`

func benchRelayDrain(b *testing.B, brokers []string, pool, relayPool *pgxpool.Pool, phases *benchPhases,
	batch int, newWriter func() *testenv.Writer) {
	ctx := context.Background()
	var (
		raw, relayed benchRate
		spent        = map[string][]time.Duration{}
	)
	for range b.N {
		rawTopic := testenv.NewTopic(b, brokers, 6)
		relayTopic := testenv.NewTopic(b, brokers, 6)

		fillStart := time.Now()
		if _, err := pool.Exec(ctx, "TRUNCATE outbox_events"); err != nil {
			b.Fatalf("emptying the outbox: %v", err)
		}
		if _, err := pool.Exec(ctx, fillBacklog, drainBacklog, outbox.Partitions); err != nil {
			b.Fatalf("filling the backlog: %v", err)
		}
		// A backlog built up by real commits has been autovacuumed and
		// analyzed along the way; give this one the same start.
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_events"); err != nil {
			b.Fatalf("vacuuming the backlog: %v", err)
		}
		b.Logf("backlog of %d events written and vacuumed in %v", drainBacklog, time.Since(fillStart).Round(time.Millisecond))

		// The messages are read back for each raw run and dropped after
		// it: kept through the relay's drain, a backlog's worth of them
		// (about 1 GB for 1,000,000 events) would make every garbage
		// collection of this process scan them, and the relay, which runs
		// here, would be charged for it (BENCHMARKS.md, issue 23).
		produce := func() {
			msgs := benchBacklogMessages(b, pool, rawTopic)
			w := newWriter()
			defer benchCloseWriter(w)
			benchProduceRaw(b, w, msgs, batch, &raw)
		}

		produce()
		runtime.GC()
		w := newWriter()
		relay, err := outbox.NewRelay(relayPool, &benchTimedWriter{w: w, phases: phases}, outbox.RelayConfig{
			Topic:     func(string) string { return relayTopic },
			BatchSize: batch,
			Logger:    benchLogger,
		})
		if err != nil {
			b.Fatal(err)
		}
		before := phases.mark()
		start := time.Now()
		total := 0
		for {
			n, err := relay.RelayBatch(ctx)
			if err != nil {
				b.Fatalf("relay batch after %d events: %v", total, err)
			}
			if n == 0 {
				break
			}
			total += n
		}
		relayed.Add(total, time.Since(start))
		for kind, ds := range phases.since(before) {
			spent[kind] = append(spent[kind], ds...)
		}
		relay.Close()
		benchCloseWriter(w)
		produce()

		if pending := benchCount(b, pool, "state <> 'published'"); pending != 0 || total != drainBacklog {
			b.Fatalf("relayed %d events, %d rows not published; want %d and 0", total, pending, drainBacklog)
		}
		if got := benchTopicMessages(b, brokers, relayTopic); got != drainBacklog {
			b.Fatalf("the relay's topic holds %d messages, want %d", got, drainBacklog)
		}
	}
	benchReportDrain(b, relayed, raw)
	batches := math.Ceil(float64(relayed.Events) / float64(batch))
	b.ReportMetric(benchMillis(relayed.Elapsed)/batches, "ms/batch")
	for _, kind := range benchPhaseKinds {
		b.ReportMetric(benchMillis(benchSum(spent[kind]))/batches, kind+"-ms/batch")
	}
}

// benchCloseWriter closes w, and with it its transport (testenv.Writer),
// so that a benchmark that made many writers does not measure their idle
// metadata refreshes as the relay's work.
func benchCloseWriter(w *testenv.Writer) { _ = w.Close() }

// benchTimedWriter times the relay's writes to the broker as the phase "kafka".
type benchTimedWriter struct {
	w      outbox.Writer
	phases *benchPhases
}

func (t *benchTimedWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	start := time.Now()
	err := t.w.WriteMessages(ctx, msgs...)
	t.phases.record("kafka", time.Since(start))
	return err
}

// benchPhases records how long each phase of the relay's batches took: its
// writes to the broker (through benchTimedWriter) and its SQL statements by
// kind (as the pgx.QueryTracer of the relay's pool). A claim's time runs
// until its rows are read and decoded, since pgx ends a query's trace when
// its rows are closed.
type benchPhases struct {
	mu    sync.Mutex
	times map[string][]time.Duration
}

// benchPhaseKinds are the phases of one relay batch, in order. ("begin" and
// "lock_timeout" are one short round trip each.)
var benchPhaseKinds = []string{"claim", "kafka", "mark", "commit"}

func newBenchPhases() *benchPhases { return &benchPhases{times: map[string][]time.Duration{}} }

func (p *benchPhases) record(kind string, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.times[kind] = append(p.times[kind], d)
}

// mark returns a bookmark for since.
func (p *benchPhases) mark() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]int{}
	for kind, ds := range p.times {
		m[kind] = len(ds)
	}
	return m
}

// since returns the times recorded after the bookmark.
func (p *benchPhases) since(m map[string]int) map[string][]time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string][]time.Duration{}
	for kind, ds := range p.times {
		out[kind] = slices.Clone(ds[m[kind]:])
	}
	return out
}

type benchTraceKey struct{}

type benchTraceStart struct {
	kind string
	at   time.Time
}

func (p *benchPhases) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, benchTraceKey{}, benchTraceStart{benchSQLKind(data.SQL), time.Now()})
}

func (p *benchPhases) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if s, ok := ctx.Value(benchTraceKey{}).(benchTraceStart); ok {
		p.record(s.kind, time.Since(s.at))
	}
}

// TraceBatchStart, TraceBatchQuery and TraceBatchEnd time the relay's
// pipelines (pgx.Batch) as one phase each, named after the most telling
// statement in it: a pipeline that claims is "claim", one that marks rows
// published is "mark", one that only commits is "commit".
func (p *benchPhases) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, benchTraceKey{}, &benchBatchTrace{at: time.Now()})
}

func (p *benchPhases) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if t, ok := ctx.Value(benchTraceKey{}).(*benchBatchTrace); ok {
		t.kinds = append(t.kinds, benchSQLKind(data.SQL))
	}
}

func (p *benchPhases) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	t, ok := ctx.Value(benchTraceKey{}).(*benchBatchTrace)
	if !ok {
		return
	}
	for _, kind := range []string{"claim", "mark", "commit"} {
		if slices.Contains(t.kinds, kind) {
			p.record(kind, time.Since(t.at))
			return
		}
	}
	p.record("other", time.Since(t.at))
}

type benchBatchTrace struct {
	at    time.Time
	kinds []string
}

// benchSQLKind names the relay's statements by their text (relay_sql.go); one
// that changes shape shows up as "other" and its phase reads 0.
func benchSQLKind(sql string) string {
	switch {
	case strings.Contains(sql, "FOR UPDATE OF o"):
		return "claim"
	case strings.Contains(sql, "SET state = 'published'"):
		return "mark"
	case sql == "commit", sql == "begin", sql == "rollback":
		return sql
	case strings.HasPrefix(sql, "SET LOCAL lock_timeout"):
		return "lock_timeout"
	}
	return "other"
}

func benchSum(ds []time.Duration) (sum time.Duration) {
	for _, d := range ds {
		sum += d
	}
	return sum
}

// benchBacklogMessages reads the backlog back, in the relay's order, as the
// Kafka messages the relay will build from it.
func benchBacklogMessages(b *testing.B, pool *pgxpool.Pool, topic string) []kafka.Message {
	b.Helper()
	rows, _ := pool.Query(context.Background(), `
		SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
		       payload, headers, occurred_at
		FROM outbox_events ORDER BY id`)
	msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (kafka.Message, error) {
		var (
			ev      event.Envelope
			headers struct{ CorrelationID, CausationID, Traceparent string }
		)
		var rawHeaders []byte
		if err := row.Scan(&ev.EventID, &ev.AggregateType, &ev.AggregateID, &ev.AggregateVersion,
			&ev.EventType, &ev.EventVersion, &ev.Payload, &rawHeaders, &ev.OccurredAt); err != nil {
			return kafka.Message{}, err
		}
		if err := json.Unmarshal(rawHeaders, &headers); err != nil {
			return kafka.Message{}, err
		}
		ev.CorrelationID, ev.CausationID, ev.Traceparent = headers.CorrelationID, headers.CausationID, headers.Traceparent
		return event.ToKafka(topic, ev), nil
	})
	if err != nil {
		b.Fatalf("reading the backlog: %v", err)
	}
	return msgs
}

// benchReportLag reports a lag benchmark's rate and its commit-to-ack and
// commit-to-consumer lags.
func benchReportLag(b *testing.B, events benchRate, ackLag, consumeLag []time.Duration) {
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(events.PerSecond(), "events/s")
	b.ReportMetric(benchMillis(benchPercentile(ackLag, 0.50)), "ack-p50-ms")
	b.ReportMetric(benchMillis(benchPercentile(ackLag, 0.99)), "ack-p99-ms")
	b.ReportMetric(benchMillis(benchPercentile(ackLag, 1)), "ack-max-ms")
	b.ReportMetric(benchMillis(benchPercentile(consumeLag, 0.50)), "consume-p50-ms")
	b.ReportMetric(benchMillis(benchPercentile(consumeLag, 0.99)), "consume-p99-ms")
}

// benchProduceRaw writes msgs with w, batch messages a call, as a producer
// writing straight to Kafka would, and adds the time it took to raw: the
// baseline of the drain benchmarks.
func benchProduceRaw(b *testing.B, w *testenv.Writer, msgs []kafka.Message, batch int, raw *benchRate) {
	start := time.Now()
	for i := 0; i < len(msgs); i += batch {
		if err := w.WriteMessages(context.Background(), msgs[i:min(i+batch, len(msgs))]...); err != nil {
			b.Fatalf("raw produce: %v", err)
		}
	}
	raw.Add(len(msgs), time.Since(start))
}

// benchReportDrain reports a drain benchmark's rates against the raw
// baseline's, and the backlog's size.
func benchReportDrain(b *testing.B, relayed, raw benchRate) {
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(relayed.PerSecond(), "relay-events/s")
	b.ReportMetric(raw.PerSecond(), "raw-events/s")
	b.ReportMetric(relayed.PerSecond()/raw.PerSecond(), "ratio")
	b.ReportMetric(float64(drainBacklog), "events")
}

// ---------------------------------------------------------------------------
// 3. Commit-to-ack lag under a steady trickle.
// ---------------------------------------------------------------------------

// BenchmarkPublishLag commits one event per transaction at a steady rate
// (1,000 events/s) while relay.Run publishes them, woken by LISTEN/NOTIFY,
// and measures for every event the time from its commit (when Commit
// returned) to the broker's acknowledgement of it (when the relay's
// WriteMessages returned), and to its arrival at a consumer of the topic.
// Goal: ack p99 ≤ 10 ms. Beside it: the relay's cycle (the time between two
// successive acks, i.e. one claim-publish-mark-commit round; an event waits
// for the round in progress, then rides the next) and the time of each of
// its phases, which split the lag into its causes.
//
// It then shows that the relay idles between commits: over an idle window
// after the load, the batches it published (none), the claims it ran (each
// RelayBatch runs one: the fallback poll, once per PollInterval), and the CPU
// time of this process and of the database backends serving the relay.
//
// The sub-benchmarks after the first are knobs: the kafka-go writer's
// BatchTimeout (a partly filled batch waits this long before it is sent),
// synchronous_commit=off on the relay's connections, both, and a lower rate.
func BenchmarkPublishLag(b *testing.B) {
	for _, c := range []struct {
		name          string
		rate          int
		writerTimeout time.Duration
		syncCommit    string
	}{
		{name: "rate=1000", rate: 1000},
		{name: "rate=1000/writer-BatchTimeout=200us", rate: 1000, writerTimeout: 200 * time.Microsecond},
		{name: "rate=1000/relay-synchronous_commit=off", rate: 1000, syncCommit: "off"},
		{name: "rate=1000/writer-BatchTimeout=200us/relay-synchronous_commit=off", rate: 1000,
			writerTimeout: 200 * time.Microsecond, syncCommit: "off"},
		{name: "rate=200", rate: 200},
	} {
		b.Run(c.name, func(b *testing.B) { benchPublishLag(b, c.rate, c.writerTimeout, cmp.Or(c.syncCommit, "on")) })
	}
}

func benchPublishLag(b *testing.B, rate int, writerTimeout time.Duration, relaySyncCommit string) {
	ctx := context.Background()
	brokers := testenv.KafkaBrokers(b)
	topic := testenv.NewTopic(b, brokers, 6)
	dbURL := testenv.NewDatabase(b)
	pool := benchPool(b, dbURL, lagProducers+1, "on", nil)
	benchMigrate(b, pool)
	phases := newBenchPhases()
	relayPool := benchPool(b, dbURL, 4, relaySyncCommit, phases)

	acked := newBenchClock()
	w := testenv.NewWriter(brokers, 500)
	if writerTimeout > 0 {
		w.BatchTimeout = writerTimeout
	}
	defer benchCloseWriter(w)
	reg := prometheus.NewRegistry()
	aw := &benchAckWriter{benchTimedWriter: benchTimedWriter{w: w, phases: phases}, acked: acked}
	relay, err := outbox.NewRelay(relayPool, aw, outbox.RelayConfig{
		Topic:   func(string) string { return topic },
		Metrics: outbox.NewMetrics(reg),
		Logger:  benchLogger,
	})
	if err != nil {
		b.Fatal(err)
	}
	// The same idle window before the relay starts is the baseline: what
	// this process and the database use for nothing at all.
	debug.FreeOSMemory()
	baseCPU, baseDBCPU := benchIdleCPU(b, pool, lagIdle)

	defer testenv.RunInBackground(b, "relay.Run", relay.Run)()

	var (
		ackLag, consumeLag       []time.Duration
		events                   benchRate
		batches, lagHist         benchHist
		idleBatches, idleClaims  float64
		idleCPU, idleDBCPU, idle time.Duration
		cycles                   []time.Duration
		spent                    = map[string][]time.Duration{}
	)
	for range b.N {
		arrived := newBenchClock()
		stopConsumers := benchConsume(b, brokers, topic, 6, arrived)

		// Warm up: the relay takes its partitions, the writer its metadata,
		// the consumers their first fetch.
		warm, err := benchTrickle(ctx, pool, outbox.Enqueue, rate, int(lagWarmUp.Seconds()*float64(rate)), newBenchClock())
		if err != nil {
			b.Fatal(err)
		}
		testenv.WaitFor(b, 30*time.Second, "the warm-up events to be acked and consumed", func() (bool, error) {
			return acked.HasAll(warm) && arrived.HasAll(warm), nil
		})

		batchesBefore := benchHistogram(b, reg, "outbox_batch_size")
		lagBefore := benchHistogram(b, reg, "outbox_publish_lag_seconds")
		phasesBefore := phases.mark()
		committed := newBenchClock()
		start := time.Now()
		ids, err := benchTrickle(ctx, pool, outbox.Enqueue, rate, int(lagLoad.Seconds()*float64(rate)), committed)
		if err != nil {
			b.Fatal(err)
		}
		events.Add(len(ids), time.Since(start))
		testenv.WaitFor(b, 30*time.Second, "every event to be acked and consumed", func() (bool, error) {
			return acked.HasAll(ids) && arrived.HasAll(ids), nil
		})
		for kind, ds := range phases.since(phasesBefore) {
			spent[kind] = append(spent[kind], ds...)
		}
		cycles = append(cycles, acked.Intervals(ids)...)
		batches = batches.plus(benchHistogram(b, reg, "outbox_batch_size").minus(batchesBefore))
		lagHist = lagHist.plus(benchHistogram(b, reg, "outbox_publish_lag_seconds").minus(lagBefore))
		ackLag = append(ackLag, committed.LagsUntil(acked, ids)...)
		consumeLag = append(consumeLag, committed.LagsUntil(arrived, ids)...)

		// Idle: no commits, no consumers. A relay that polled in a loop
		// would show here as batches, CPU time, or database work.
		stopConsumers()
		// Return the heap to the OS now, or the runtime's background
		// scavenger does it during the window and is counted as idle CPU.
		debug.FreeOSMemory()
		testenv.WaitFor(b, 30*time.Second, "the last batch to be marked published", func() (bool, error) {
			var unpublished int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE state <> 'published'`).Scan(&unpublished)
			return unpublished == 0, err
		})
		batchesBefore, phasesBefore = benchHistogram(b, reg, "outbox_batch_size"), phases.mark()
		cpu, dbCPU := benchIdleCPU(b, pool, lagIdle)
		idleCPU, idleDBCPU, idle = idleCPU+cpu, idleDBCPU+dbCPU, idle+lagIdle
		idleBatches += benchHistogram(b, reg, "outbox_batch_size").minus(batchesBefore).count
		idleClaims += float64(len(phases.since(phasesBefore)["claim"]))
	}
	benchReportLag(b, events, ackLag, consumeLag)
	b.ReportMetric(lagHist.quantile(0.99)*1000, "hist-p99-ms")
	b.ReportMetric(batches.sum/batches.count, "events/batch")
	b.ReportMetric(float64(len(spent["claim"]))/batches.count, "claims/batch")
	b.ReportMetric(benchMillis(benchPercentile(cycles, 0.50)), "cycle-p50-ms")
	b.ReportMetric(benchMillis(benchPercentile(cycles, 0.99)), "cycle-p99-ms")
	for _, kind := range benchPhaseKinds {
		b.ReportMetric(benchMillis(benchSum(spent[kind]))/batches.count, kind+"-ms/batch")
		b.ReportMetric(benchMillis(benchPercentile(spent[kind], 0.99)), kind+"-p99-ms")
	}
	b.ReportMetric(idleBatches, "idle-batches")
	b.ReportMetric(idleClaims/idle.Seconds(), "idle-claims/s")
	b.ReportMetric(benchMillis(idleCPU)/idle.Seconds(), "idle-cpu-ms/s")
	b.ReportMetric(benchMillis(idleDBCPU)/idle.Seconds(), "idle-db-cpu-ms/s")
	b.ReportMetric(benchMillis(baseCPU)/lagIdle.Seconds(), "base-cpu-ms/s")
	b.ReportMetric(benchMillis(baseDBCPU)/lagIdle.Seconds(), "base-db-cpu-ms/s")
}

// benchIdleCPU returns the CPU time this process and the backends of pool's
// database use during the next d. Backend time has the kernel's resolution
// of 10 ms.
func benchIdleCPU(b *testing.B, pool *pgxpool.Pool, d time.Duration) (process, backends time.Duration) {
	b.Helper()
	cpu, dbCPU := benchProcessCPU(), benchBackendCPU(b, pool)
	<-time.After(d) // the measurement window itself, not a wait for a condition
	process = benchProcessCPU() - cpu
	const clockTicks = 100 // USER_HZ on Linux
	for pid, ticks := range benchBackendCPU(b, pool) {
		if before, ok := dbCPU[pid]; ok { // a backend that came or went is not idle work
			backends += time.Duration(ticks-before) * time.Second / clockTicks
		}
	}
	return process, backends
}

// benchAckWriter is the relay's writer with a stopwatch: it records when the
// broker acknowledged each event, the end of the commit-to-ack lag.
type benchAckWriter struct {
	benchTimedWriter
	acked *benchClock
}

func (a *benchAckWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	err := a.benchTimedWriter.WriteMessages(ctx, msgs...)
	now := time.Now()
	if err == nil {
		for _, m := range msgs {
			a.acked.Mark(benchEventID(m), now)
		}
	}
	return err
}

// benchConsume reads every partition of topic from the start, recording when
// each event arrived, until the returned stop is called.
func benchConsume(b *testing.B, brokers []string, topic string, partitions int, arrived *benchClock) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for p := range partitions {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers: brokers, Topic: topic, Partition: p,
			MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 100 * time.Millisecond,
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					if ctx.Err() == nil {
						b.Errorf("consuming partition %d: %v", p, err)
					}
					return
				}
				arrived.Mark(benchEventID(m), time.Now())
			}
		}()
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	b.Cleanup(stop)
	return stop
}

func benchEventID(m kafka.Message) string {
	for _, h := range m.Headers {
		if h.Key == event.HeaderEventID {
			return string(h.Value)
		}
	}
	return ""
}

// benchHist is a snapshot of a Prometheus histogram.
type benchHist struct {
	count, sum float64
	bounds     []float64 // upper bounds, ascending
	cumulative []float64 // observations ≤ each bound
}

func benchHistogram(b *testing.B, g prometheus.Gatherer, name string) benchHist {
	b.Helper()
	families, err := g.Gather()
	if err != nil {
		b.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		s := benchHist{count: float64(h.GetSampleCount()), sum: h.GetSampleSum()}
		for _, bk := range h.GetBucket() {
			s.bounds = append(s.bounds, bk.GetUpperBound())
			s.cumulative = append(s.cumulative, float64(bk.GetCumulativeCount()))
		}
		return s
	}
	b.Fatalf("no histogram %s", name)
	return benchHist{}
}

// minus returns the observations made since before.
func (h benchHist) minus(before benchHist) benchHist { return h.combine(before, -1) }

// plus adds the observations of o, a snapshot of the same histogram (or zero).
func (h benchHist) plus(o benchHist) benchHist { return h.combine(o, 1) }

func (h benchHist) combine(o benchHist, sign float64) benchHist {
	if o.bounds == nil {
		return h
	}
	if h.bounds == nil {
		h = benchHist{bounds: o.bounds, cumulative: make([]float64, len(o.bounds))}
	}
	d := benchHist{count: h.count + sign*o.count, sum: h.sum + sign*o.sum, bounds: h.bounds}
	for i := range h.cumulative {
		d.cumulative = append(d.cumulative, h.cumulative[i]+sign*o.cumulative[i])
	}
	return d
}

// quantile interpolates linearly inside the bucket holding quantile q, as
// Prometheus's histogram_quantile does.
func (h benchHist) quantile(q float64) float64 {
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, upper := range h.bounds {
		if h.cumulative[i] >= rank {
			return lower + (upper-lower)*(rank-below)/(h.cumulative[i]-below)
		}
		lower, below = upper, h.cumulative[i]
	}
	return math.Inf(1)
}

// benchProcessCPU is the user and system CPU time this process used so far.
func benchProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchBackendCPU is the CPU time used so far by each Postgres backend
// connected to pool's database, read from /proc (the benchmark runs on the
// database's machine), in clock ticks.
func benchBackendCPU(b *testing.B, pool *pgxpool.Pool) map[int32]int64 {
	b.Helper()
	rows, _ := pool.Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatalf("listing backends: %v", err)
	}
	ticks := map[int32]int64{}
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			b.Fatalf("reading the CPU time of backend %d (is Postgres on this machine?): %v", pid, err)
		}
		// Fields after the command name, which is in parentheses: utime and
		// stime are the 12th and 13th of them.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		for _, f := range fields[11:13] {
			n, _ := strconv.ParseInt(f, 10, 64)
			ticks[pid] += n
		}
	}
	return ticks
}

// ---------------------------------------------------------------------------
// Helpers shared by the benchmarks.
// ---------------------------------------------------------------------------

// benchPool opens a pool of maxConns on url whose sessions use the given
// synchronous_commit, traced by tracer if not nil, closed when the benchmark
// ends.
func benchPool(b *testing.B, url string, maxConns int32, syncCommit string, tracer pgx.QueryTracer) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = syncCommit
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatalf("opening pool: %v", err)
	}
	b.Cleanup(pool.Close)
	return pool
}

func benchMigrate(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	if err := testenv.Migrate(pool, testenv.Migration{FS: outbox.Migrations, Table: outbox.MigrationsTable}); err != nil {
		b.Fatalf("migrating: %v", err)
	}
}

func benchCount(b *testing.B, pool *pgxpool.Pool, where string) int {
	b.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_events WHERE "+where).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// benchTopicMessages is how many messages topic holds (it starts empty).
func benchTopicMessages(b *testing.B, brokers []string, topic string) int {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A transport of its own, closed after: the default one is shared and
	// keeps refreshing metadata in the background for the process's life.
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: transport}
	meta, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil || len(meta.Topics) != 1 {
		b.Fatalf("reading the partitions of %s: %v", topic, err)
	}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, p := range meta.Topics[0].Partitions {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p.ID))
	}
	res, err := c.ListOffsets(ctx, req)
	if err != nil {
		b.Fatalf("listing the offsets of %s: %v", topic, err)
	}
	total := 0
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			b.Fatalf("offsets of %s[%d]: %v", topic, p.Partition, p.Error)
		}
		total += int(p.LastOffset)
	}
	return total
}

// benchPercentile is the nearest-rank q-quantile of ds (q = 1: the maximum).
func benchPercentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(q*float64(len(s))))-1)]
}

func benchMillis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func benchWALPosition(b *testing.B, pool *pgxpool.Pool) string {
	b.Helper()
	var lsn string
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	return lsn
}

func benchWALSince(b *testing.B, pool *pgxpool.Pool, lsn string) int64 {
	b.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, lsn).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}
