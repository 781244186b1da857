// The consumption benchmarks run billing's real inbox handler against the real
// PostgreSQL and Kafka that `make up` starts. A shared 2-core box is too noisy
// for an absolute number to mean much on its own, so each benchmark measures
// its baseline in the same run and reports the RATIO beside the raw rates.
// Run them with `make bench-inbox`; BENCHMARKS.md explains every number.
//
// Every benchmark is a whole experiment per b.N iteration, so run them with
// -benchtime 1x; ns/op is suppressed because it would time the setup too.

package billing_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgutil"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/billing"
)

// ---------------------------------------------------------------------------
// 1. Events per second, with and without redeliveries.
// ---------------------------------------------------------------------------

// BenchmarkConsume pre-fills a topic with consumeOrders OrderPlaced events,
// then times billing's consumer (billing.Handle in an inbox.Consumer with
// the production defaults) until the inbox has counted every delivery. It
// alternates a clean topic with one that also holds 10% duplicate deliveries
// (clean, dup, clean, dup, …), so that drift in the machine's speed falls on
// both alike, and reports both rates, each run's rate, and the ratio
// dup/clean. Goals: ≥ 10,000 events/s clean, a ratio ≥ 0.90, and zero double
// charges, which every run checks (one charge and one PaymentCaptured per
// order).
//
// Beside the rates, where the time goes: the CPU time this process (the
// consumer, kafka-go, and the kernel's share of their sockets) and the
// database's backends spend per event, how busy the whole machine was, how
// many events one commit carried, how many round trips to Postgres one event
// took, and the pg_subtrans accesses per event.
func BenchmarkConsume(b *testing.B) {
	brokers := testinfra.KafkaBrokers(b)
	var clean, dup consumeRate
	var runs []consumeResult
	for range b.N {
		for i := range consumePairs * 2 {
			res := consumeRun(b, brokers, consumeSetup{orders: consumeOrders, duplicates: i%2 == 1})
			runs = append(runs, res)
			if res.duplicates > 0 {
				dup.add(res)
			} else {
				clean.add(res)
			}
		}
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(clean.perSecond(), "clean-events/s")
	b.ReportMetric(dup.perSecond(), "dup-events/s")
	b.ReportMetric(dup.perSecond()/clean.perSecond(), "ratio")
	for i, r := range runs {
		kind := "clean"
		if r.duplicates > 0 {
			kind = "dup"
		}
		b.ReportMetric(r.perSecond(), fmt.Sprintf("run%d-%s-events/s", i+1, kind))
	}
	b.ReportMetric(clean.goCPUPerEvent(), "clean-go-cpu-µs/event")
	b.ReportMetric(clean.pgCPUPerEvent(), "clean-pg-cpu-µs/event")
	b.ReportMetric(dup.goCPUPerEvent(), "dup-go-cpu-µs/event")
	b.ReportMetric(dup.pgCPUPerEvent(), "dup-pg-cpu-µs/event")
	b.ReportMetric(clean.busy(), "clean-machine-busy-%")
	b.ReportMetric(clean.perCommit(), "clean-events/commit")
	b.ReportMetric(clean.roundTrips(), "clean-round-trips/event")
	b.ReportMetric(clean.subtransPerEvent(), "clean-subtrans-accesses/event")
}

const (
	consumeOrders = 20_000
	consumePairs  = 3 // clean/dup pairs per b.N iteration
	// A duplicate delivery follows every dupEvery-th message: 10%.
	dupEvery = 10
)

// ---------------------------------------------------------------------------
// 2. The knobs teams will tune.
// ---------------------------------------------------------------------------

// BenchmarkConsumeKnobs changes one setting at a time against the defaults
// (Workers 4, BatchSize 100, the pgxpool default of max(4, cores)
// connections, synchronous_commit on), on clean topics of knobOrders events,
// in the order default, variant, variant, default. It reports both rates and
// the ratio variant/default: above 1 the variant is faster.
//
// Workers=8 alone keeps the default pool, as billing is wired today, so at
// most four workers hold a connection at once; Workers=8/MaxConns=8 gives
// each its own. BatchSize=50 is a diagnosis: it keeps a transaction's
// savepoints (one per message) under the 64 subtransactions Postgres caches
// per backend, past which every snapshot in the cluster overflows to
// pg_subtrans (see benchSubtransAccesses).
//
// synchronous_commit=off is not a configuration to copy without thought: it
// is set on the benchmark's own connections and lets a crash of Postgres lose
// the last few hundred milliseconds of commits, charges and inbox rows alike
// (they stay consistent with each other; Kafka redelivers what was lost, as
// its offsets commit only after the database). It is here to show how much of
// the time is the WAL flush.
func BenchmarkConsumeKnobs(b *testing.B) {
	brokers := testinfra.KafkaBrokers(b)
	for _, v := range []struct {
		name  string
		setup consumeSetup
	}{
		{"Workers=1", consumeSetup{workers: 1}},
		{"Workers=8", consumeSetup{workers: 8}},
		{"Workers=8/MaxConns=8", consumeSetup{workers: 8, maxConns: 8}},
		{"BatchSize=1", consumeSetup{batchSize: 1}},
		{"BatchSize=500", consumeSetup{batchSize: 500}},
		{"BatchSize=50", consumeSetup{batchSize: 50}},
		{"synchronous_commit=off", consumeSetup{syncCommitOff: true}},
	} {
		b.Run(v.name, func(b *testing.B) {
			variant := v.setup
			variant.orders = knobOrders
			var base, varied consumeRate
			for range b.N {
				for _, isVariant := range []bool{false, true, true, false} {
					if isVariant {
						varied.add(consumeRun(b, brokers, variant))
					} else {
						base.add(consumeRun(b, brokers, consumeSetup{orders: knobOrders}))
					}
				}
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(base.perSecond(), "default-events/s")
			b.ReportMetric(varied.perSecond(), "variant-events/s")
			b.ReportMetric(varied.perSecond()/base.perSecond(), "ratio")
			b.ReportMetric(base.perCommit(), "default-events/commit")
			b.ReportMetric(varied.perCommit(), "variant-events/commit")
			b.ReportMetric(base.goCPUPerEvent()+base.pgCPUPerEvent(), "default-cpu-µs/event")
			b.ReportMetric(varied.goCPUPerEvent()+varied.pgCPUPerEvent(), "variant-cpu-µs/event")
			b.ReportMetric(base.subtransPerEvent(), "default-subtrans-accesses/event")
			b.ReportMetric(varied.subtransPerEvent(), "variant-subtrans-accesses/event")
		})
	}
}

const knobOrders = 8_000

// ---------------------------------------------------------------------------
// One run: a fresh topic and database, pre-filled, consumed to the end.
// ---------------------------------------------------------------------------

// consumeSetup describes one run; zero fields take the production defaults.
type consumeSetup struct {
	orders        int
	duplicates    bool // add one duplicate delivery per dupEvery messages
	workers       int  // inbox.Config.Workers
	batchSize     int  // inbox.Config.BatchSize
	maxConns      int32
	syncCommitOff bool
}

type consumeResult struct {
	deliveries, duplicates int
	// elapsed runs from the first message fetched to the last one counted:
	// the consumer group's join comes before and has nothing to do with
	// throughput (it is logged beside each run).
	elapsed      time.Duration
	goCPU, pgCPU time.Duration
	busy         float64 // share of the machine's CPU time in use, 0–1
	sent         benchSent
	subtrans     int64
}

func (r consumeResult) perSecond() float64 { return float64(r.deliveries) / r.elapsed.Seconds() }

// consumeRate sums runs: events over time, not a mean of rates.
type consumeRate struct {
	deliveries   int
	elapsed      time.Duration
	goCPU, pgCPU time.Duration
	busyTime     float64
	sent         benchSent
	subtrans     int64
}

func (r *consumeRate) add(res consumeResult) {
	r.deliveries += res.deliveries
	r.elapsed += res.elapsed
	r.goCPU += res.goCPU
	r.pgCPU += res.pgCPU
	r.busyTime += res.busy * res.elapsed.Seconds()
	r.sent.commits += res.sent.commits
	r.sent.roundTrips += res.sent.roundTrips
	r.subtrans += res.subtrans
}

func (r *consumeRate) perSecond() float64     { return float64(r.deliveries) / r.elapsed.Seconds() }
func (r *consumeRate) goCPUPerEvent() float64 { return benchMicros(r.goCPU) / float64(r.deliveries) }
func (r *consumeRate) pgCPUPerEvent() float64 { return benchMicros(r.pgCPU) / float64(r.deliveries) }
func (r *consumeRate) busy() float64          { return 100 * r.busyTime / r.elapsed.Seconds() }
func (r *consumeRate) perCommit() float64 {
	return float64(r.deliveries) / float64(max(1, r.sent.commits))
}
func (r *consumeRate) roundTrips() float64 {
	return float64(r.sent.roundTrips) / float64(r.deliveries)
}
func (r *consumeRate) subtransPerEvent() float64 { return float64(r.subtrans) / float64(r.deliveries) }

// consumeRun fills a fresh topic, consumes it into a fresh database with
// billing's handler, checks that no order was charged twice, and drops both.
func consumeRun(b *testing.B, brokers []string, s consumeSetup) consumeResult {
	b.Helper()
	ctx := context.Background()
	statements := &benchStatements{}
	pool := benchPool(b, testinfra.NewDatabase(b), s.maxConns, s.syncCommitOff, statements)
	defer pool.Close() // closed before the statistics are read, and on the way out of a failed run
	if err := pgutil.Migrate(pool, billing.Schema...); err != nil {
		b.Fatalf("migrating: %v", err)
	}
	topic := testinfra.NewTopic(b, brokers, 6)
	testinfra.NewTopicNamed(b, brokers, topic+".dlt", 1)
	msgs, dups := benchDeliveries(topic, s.orders, s.duplicates)
	benchProduce(b, brokers, msgs)

	reg := prometheus.NewRegistry()
	reader := &benchFirstFetch{billing: billing.New(pool, benchLogger, nil)}
	dlq := kafkautil.NewWriter(brokers, 100)
	defer dlq.Close()
	src := inbox.GroupConfig{Brokers: brokers, Topic: topic, Group: testinfra.Name("billing")}
	consumer, err := inbox.NewBatchConsumer(pool, src, dlq, reader, inbox.Config{
		Name:      "billing",
		Workers:   s.workers,
		BatchSize: s.batchSize,
		Logger:    benchLogger,
		Metrics:   inbox.NewMetrics(reg),
	})
	if err != nil {
		b.Fatal(err)
	}

	cpu, sent, subtrans := benchSnapshot(b, pool), statements.snapshot(), benchSubtransAccesses(b, "")
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx) }()
	counted := func() int {
		return int(testinfra.MetricValue(b, reg, "inbox_processed_total") +
			testinfra.MetricValue(b, reg, "inbox_duplicates_total"))
	}
	deadline := time.Now().Add(5 * time.Minute)
	for counted() < len(msgs) {
		select {
		case err := <-done:
			b.Fatalf("the consumer stopped after %d of %d deliveries: %v", counted(), len(msgs), err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Fatalf("the consumer counted %d of %d deliveries in 5 minutes", counted(), len(msgs))
		}
	}
	end := time.Now()
	used, sent := benchSnapshot(b, pool).since(cpu), statements.snapshot().minus(sent)
	stop()
	if err := <-done; err != nil {
		b.Fatalf("consumer: %v", err)
	}

	// Zero double charges, and nothing counted twice or lost on the way.
	if got := testinfra.MetricValue(b, reg, "inbox_duplicates_total"); int(got) != dups {
		b.Fatalf("inbox_duplicates_total = %v, want %d", got, dups)
	}
	if got := testinfra.MetricValue(b, reg, "inbox_dead_lettered_total"); got != 0 {
		b.Fatalf("%v events dead-lettered, want 0", got)
	}
	if n := benchCount(b, pool, "SELECT count(*) FROM charges"); n != s.orders {
		b.Fatalf("%d charges for %d orders", n, s.orders)
	}
	outboxtest.RequireManyEnqueued(b, pool, outboxtest.Match{EventType: billing.EventPaymentCaptured}, s.orders)
	pool.Close()
	subtrans = benchSubtransAccesses(b, pool.Config().ConnConfig.Database) - subtrans

	res := consumeResult{deliveries: len(msgs), duplicates: dups, elapsed: end.Sub(reader.first()),
		goCPU: used.process, pgCPU: used.backends, busy: used.busy, sent: sent, subtrans: subtrans}
	b.Logf("%d deliveries (%d duplicates) in %v after a group join of %v: %.0f events/s, %.1f events/commit, "+
		"%.1f round trips/event, %.1f pg_subtrans accesses/event, CPU µs/event: %.0f Go + %.0f Postgres; machine %.0f%% busy",
		res.deliveries, dups, res.elapsed.Round(time.Millisecond), reader.first().Sub(cpu.at).Round(time.Millisecond),
		res.perSecond(), float64(res.deliveries)/float64(max(1, sent.commits)), float64(sent.roundTrips)/float64(res.deliveries),
		float64(subtrans)/float64(res.deliveries),
		benchMicros(used.process)/float64(res.deliveries), benchMicros(used.backends)/float64(res.deliveries), 100*res.busy)
	return res
}

// benchDeliveries returns the messages of orders OrderPlaced events, keyed
// by order id, and with duplicates one redelivery after every dupEvery-th
// message: a copy of one of the last thousand messages, so it lands behind
// its original in the same partition as a real redelivery would. It also
// returns how many duplicates it added.
func benchDeliveries(topic string, orders int, duplicates bool) ([]kafka.Message, int) {
	rnd := rand.New(rand.NewPCG(1, 2)) // the same interleaving every run
	msgs := make([]kafka.Message, 0, orders+orders/dupEvery)
	originals := make([]kafka.Message, 0, orders)
	for i := range orders {
		m := event.ToKafka(topic, placed(uuid.New()))
		msgs = append(msgs, m)
		originals = append(originals, m)
		if duplicates && i%dupEvery == dupEvery-1 {
			msgs = append(msgs, originals[len(originals)-1-rnd.IntN(min(1000, len(originals)))])
		}
	}
	return msgs, len(msgs) - orders
}

// benchProduce writes msgs in large batches.
func benchProduce(b *testing.B, brokers []string, msgs []kafka.Message) {
	b.Helper()
	w := kafkautil.NewWriter(brokers, 1000)
	defer w.Close()
	const chunk = 6000 // a thousand per partition
	for i := 0; i < len(msgs); i += chunk {
		if err := w.WriteMessages(context.Background(), msgs[i:min(i+chunk, len(msgs))]...); err != nil {
			b.Fatalf("pre-filling the topic: %v", err)
		}
	}
}

// benchFirstFetch wraps billing's handler, as the service runs it
// (inbox.NewBatchConsumer), noting when the first message arrived: the end
// of the consumer group's join.
type benchFirstFetch struct {
	billing *billing.Billing
	once    sync.Once
	mu      sync.Mutex
	at      time.Time
}

func (r *benchFirstFetch) arrived() {
	r.once.Do(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.at = time.Now()
	})
}

func (r *benchFirstFetch) Handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	r.arrived()
	return r.billing.Handle(ctx, tx, ev)
}

func (r *benchFirstFetch) HandleBatch(ctx context.Context, tx pgx.Tx, evs []inbox.Applying) error {
	r.arrived()
	return r.billing.HandleBatch(ctx, tx, evs)
}

func (r *benchFirstFetch) first() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.at
}

// ---------------------------------------------------------------------------
// Where the CPU goes: this process, the database's backends, the machine.
// ---------------------------------------------------------------------------

// benchCPU is a snapshot of the CPU time used so far.
type benchCPU struct {
	at         time.Time
	process    time.Duration           // this process
	backends   map[int32]time.Duration // each backend of the pool's database
	busy, idle int64                   // the whole machine, in clock ticks
}

// benchUsed is the CPU time used between two snapshots.
type benchUsed struct {
	process, backends time.Duration
	busy              float64
}

func benchSnapshot(b *testing.B, pool *pgxpool.Pool) benchCPU {
	b.Helper()
	s := benchCPU{at: time.Now(), backends: map[int32]time.Duration{}}
	s.process = benchProcTime("/proc/self/stat")
	rows, _ := pool.Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatalf("listing backends: %v", err)
	}
	for _, pid := range pids {
		s.backends[pid] = benchProcTime(fmt.Sprintf("/proc/%d/stat", pid))
	}
	// The first line of /proc/stat: "cpu", then user nice system idle iowait
	// irq softirq steal, in clock ticks.
	if cpu := strings.Fields(benchProcLine("/proc/stat")); len(cpu) > 8 {
		for i, f := range cpu[1:9] {
			n, _ := strconv.ParseInt(f, 10, 64)
			if i == 3 || i == 4 {
				s.idle += n
			} else {
				s.busy += n
			}
		}
	}
	return s
}

// since is the CPU used from before to s. A backend that appeared in between
// counts from zero: the pool opens connections as the consumer needs them.
func (s benchCPU) since(before benchCPU) benchUsed {
	u := benchUsed{process: s.process - before.process}
	for pid, t := range s.backends {
		u.backends += t - before.backends[pid]
	}
	if total := s.busy + s.idle - before.busy - before.idle; total > 0 {
		u.busy = float64(s.busy-before.busy) / float64(total)
	}
	return u
}

// benchProcLine returns the first line of a /proc file, or "" where there is
// no /proc (the CPU metrics then read 0).
func benchProcLine(path string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	return line
}

// benchProcTime is the user and system CPU time of the process whose
// /proc/<pid>/stat is path, to the kernel's resolution of 10 ms.
func benchProcTime(path string) time.Duration {
	// Fields after the command name, which is in parentheses: utime and
	// stime are the 12th and 13th of them.
	line := benchProcLine(path)
	fields := strings.Fields(line[strings.LastIndexByte(line, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	const clockTicks = 100 // USER_HZ on Linux
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// benchSubtransAccesses reads how often the server has accessed pg_subtrans
// so far (all databases), where Postgres records each subtransaction's parent
// (once per savepoint that writes) and looks it up when it must. The lookups
// are the symptom of a transaction with more subtransactions than the 64
// Postgres caches per backend: while one runs, every snapshot in the cluster
// is "suboverflowed" and checking whether a row is visible may need one. With
// database, it first waits until the backends of database have exited, which
// flushes their statistics.
func benchSubtransAccesses(b *testing.B, database string) int64 {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testinfra.PostgresAdminURL())
	if err != nil {
		b.Fatalf("connecting to read pg_stat_slru: %v", err)
	}
	defer conn.Close(ctx)
	if database != "" {
		testinfra.WaitFor(b, 20*time.Second, "the backends of "+database+" to exit", func() (bool, error) {
			var n int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, database).Scan(&n)
			return n == 0, err
		})
	}
	var n int64
	if err := conn.QueryRow(ctx,
		`SELECT blks_hit + blks_read FROM pg_stat_slru WHERE name = 'Subtrans'`).Scan(&n); err != nil {
		b.Fatalf("reading pg_stat_slru: %v", err)
	}
	return n
}

// ---------------------------------------------------------------------------
// What the consumer asks of the database.
// ---------------------------------------------------------------------------

// benchStatements counts, as the pgx tracer of the consumer's pool, the
// commits and the round trips (a statement, or a pipelined batch of them)
// the consumer makes: how many events one commit carries, and how chatty
// handling one event is.
type benchStatements struct{ commits, roundTrips atomic.Int64 }

type benchSent struct{ commits, roundTrips int64 }

func (s *benchStatements) snapshot() benchSent {
	return benchSent{commits: s.commits.Load(), roundTrips: s.roundTrips.Load()}
}

func (s benchSent) minus(o benchSent) benchSent {
	return benchSent{commits: s.commits - o.commits, roundTrips: s.roundTrips - o.roundTrips}
}

func (s *benchStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s.roundTrips.Add(1)
	if data.SQL == "commit" {
		s.commits.Add(1)
	}
	return ctx
}

func (s *benchStatements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *benchStatements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.roundTrips.Add(1)
	return ctx
}

func (s *benchStatements) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (s *benchStatements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

// benchLogger keeps routine messages out of the results.
var benchLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// benchPool opens a pool on url, traced by tracer, closed when the benchmark
// ends. maxConns 0 keeps pgxpool's default, max(4, cores), which is what
// billing runs with.
func benchPool(b *testing.B, url string, maxConns int32, syncCommitOff bool, tracer *benchStatements) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if syncCommitOff {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatalf("opening pool: %v", err)
	}
	b.Cleanup(pool.Close)
	return pool
}

func benchCount(b *testing.B, pool *pgxpool.Pool, query string, args ...any) int {
	b.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

func benchMicros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
