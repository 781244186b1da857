//go:build linux

package outbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// ---------------------------------------------------------------------------
// The log-based relay as a process of its own: what it costs per event.
// ---------------------------------------------------------------------------

// BenchmarkCDCRelayProcess runs a CDCRelay alone in a child process (this
// test binary, started again with relayChildEnv set) and reads what only a
// process of its own can tell: its peak resident set (VmHWM) and CPU time,
// and the Go runtime's allocations, garbage collections and the relay's SQL
// statements, as deltas over one phase. These do not move with the load of a
// shared machine the way rates do, so they compare two builds run one after
// the other.
//
//   - tx: one transaction of cdcProcEvents (100,000, or
//     ONCEFLOW_BENCH_CDC_TX_EVENTS) events committed while the relay streams,
//     drained: commit → the last event's ack, and the peak heap and RSS
//     meanwhile (issue 23: ≤ 64 MB whatever the transaction's size).
//   - rate=1000: one event per transaction at 1,000 commits/s for lagLoad:
//     CPU and allocations per event at a steady rate.
//   - idle: three seconds with nothing to publish.
//
// ONCEFLOW_BENCH_CDC_CPUPROFILE=prefix writes the child's CPU profile of each
// run to prefix-<phase>-<mode>.prof (go tool pprof takes the test binary),
// ONCEFLOW_BENCH_CDC_MEMPROFILE=prefix its allocations to …mprof.
func BenchmarkCDCRelayProcess(b *testing.B) {
	for _, mode := range []outbox.RelayMode{outbox.ModeCDC, outbox.ModeWAL} {
		name := "mode=wal"
		if mode == outbox.ModeCDC {
			name = "mode=table"
		}
		b.Run("tx/"+name, func(b *testing.B) { benchCDCProcTx(b, mode) })
		b.Run("rate=1000/"+name, func(b *testing.B) { benchCDCProcRate(b, mode, 1000) })
	}
	b.Run("idle/mode=table", benchCDCProcIdle)
}

// cdcProcEvents is the tx phase's transaction size.
func cdcProcEvents() int {
	if n, err := strconv.Atoi(os.Getenv("ONCEFLOW_BENCH_CDC_TX_EVENTS")); err == nil && n > 0 {
		return n
	}
	return 100_000
}

// bigTxTable commits $1 outbox rows in one statement, the rows of
// fillBacklog (bench_test.go).
const bigTxTable = `
INSERT INTO outbox_events (
    event_id, aggregate_type, aggregate_id, aggregate_version,
    event_type, event_version, payload, headers, occurred_at, partition)
SELECT gen_random_uuid(), 'order', a.id, g / 10000 + 1, 'OrderPlaced', 1,
       jsonb_build_object('orderId', a.id, 'customerId', 'customer-' || g % 977,
                          'amountCents', 1000 + g % 5000, 'currency', 'EUR'),
       jsonb_build_object('correlationId', gen_random_uuid()::text,
                          'traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'),
       now(), mod(hashtext(a.id)::bigint + 2147483648, 256)
FROM generate_series(0, $1 - 1) AS g,
     LATERAL (SELECT 'order-' || g % 10000 AS id) AS a`

// cdcProc is a relay child process and the pipes to it.
type cdcProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	waited chan error
}

// cdcProcStats is what the child reports at each mark: totals since it
// started, peaks since the previous mark.
type cdcProcStats struct {
	Active     bool    `json:"active"`
	Acked      int64   `json:"acked"`
	CPUSeconds float64 `json:"cpu_s"`
	GCSeconds  float64 `json:"gc_cpu_s"`
	AllocBytes uint64  `json:"alloc_bytes"`
	AllocObjs  uint64  `json:"alloc_objects"`
	GCCycles   uint64  `json:"gc_cycles"`
	SQL        int64   `json:"sql"`
	PeakHeap   uint64  `json:"peak_heap"`  // since the previous mark
	PeakRSS    uint64  `json:"peak_rss"`   // VmHWM, reset at each mark
	DrainedAt  int64   `json:"drained_at"` // unix ns when acked reached want
}

// relayChildEnv carries the child's configuration (cdcChildConfig as JSON).
const relayChildEnv = "ONCEFLOW_BENCH_RELAY_CHILD"

type cdcChildConfig struct {
	DB         string   `json:"db"`
	Brokers    []string `json:"brokers"`
	Slot       string   `json:"slot"`
	Topic      string   `json:"topic"`
	Mode       string   `json:"mode"`
	Want       int64    `json:"want"`
	SampleHeap bool     `json:"sample_heap"` // costs the child some CPU: only where the peak heap is reported
	CPUProfile string   `json:"cpuprofile"`
	MemProfile string   `json:"memprofile"`
}

func startCDCProc(b *testing.B, cfg cdcChildConfig) *cdcProc {
	b.Helper()
	conf, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), relayChildEnv+"="+string(conf))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &cdcProc{cmd: cmd, stdin: stdin, lines: make(chan string, 16), waited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.waited <- cmd.Wait()
	}()
	b.Cleanup(func() { p.stop(b) })
	return p
}

// mark asks the child for its stats and resets its peaks.
func (p *cdcProc) mark(b *testing.B) cdcProcStats {
	b.Helper()
	if _, err := io.WriteString(p.stdin, "mark\n"); err != nil {
		b.Fatalf("relay child: %v", err)
	}
	select {
	case line, ok := <-p.lines:
		if !ok {
			b.Fatalf("relay child exited: %v", <-p.waited)
		}
		var s cdcProcStats
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			b.Fatalf("relay child said %q: %v", line, err)
		}
		return s
	case <-time.After(30 * time.Second):
		b.Fatal("relay child did not answer a mark in 30s")
	}
	return cdcProcStats{}
}

// waitAcked marks until the child acked at least n events.
func (p *cdcProc) waitAcked(b *testing.B, n int64, timeout time.Duration) cdcProcStats {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := p.mark(b)
		if s.Acked >= n {
			return s
		}
		if time.Now().After(deadline) {
			b.Fatalf("the relay acked %d of %d events in %v", s.Acked, n, timeout)
		}
		time.Sleep(20 * time.Millisecond) //nolint:forbidigo // polling a child process's counter
	}
}

func (p *cdcProc) stop(b *testing.B) {
	if p.stdin == nil {
		return
	}
	_ = p.stdin.Close()
	p.stdin = nil
	for range p.lines {
	}
	if err := <-p.waited; err != nil {
		b.Errorf("relay child: %v", err)
	}
}

// cdcProcEnv is a database with the outbox, a topic and a slot the child
// relay created and streams.
type cdcProcEnv struct {
	pool    *pgxpool.Pool
	brokers []string
	cfg     cdcChildConfig
}

func newCDCProcEnv(b *testing.B, mode outbox.RelayMode, want int) *cdcProcEnv {
	b.Helper()
	brokers := testenv.KafkaBrokers(b)
	url := testenv.NewDatabase(b)
	pool := benchPool(b, url, lagProducers+2, "on", nil)
	benchMigrate(b, pool)
	slot := testenv.Name("bench")
	b.Cleanup(func() {
		testenv.WaitFor(b, 20*time.Second, "the slot to be dropped", func() (bool, error) {
			_, err := pool.Exec(context.Background(),
				`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
			return err == nil, nil
		})
	})
	return &cdcProcEnv{pool: pool, brokers: brokers, cfg: cdcChildConfig{
		DB: url, Brokers: brokers, Slot: slot, Topic: testenv.NewTopic(b, brokers, 6),
		Mode: string(mode), Want: int64(want),
	}}
}

// start starts the child and waits until it streams.
func (e *cdcProcEnv) start(b *testing.B, phase string) *cdcProc {
	b.Helper()
	cfg := e.cfg
	if prefix := os.Getenv("ONCEFLOW_BENCH_CDC_CPUPROFILE"); prefix != "" {
		cfg.CPUProfile = fmt.Sprintf("%s-%s-%s.prof", prefix, phase, cfg.Mode)
	}
	if prefix := os.Getenv("ONCEFLOW_BENCH_CDC_MEMPROFILE"); prefix != "" {
		cfg.MemProfile = fmt.Sprintf("%s-%s-%s.mprof", prefix, phase, cfg.Mode)
	}
	p := startCDCProc(b, cfg)
	// Streaming, not only holding the slot: a slot is active while it is
	// being created too, and what commits before its consistent point is in
	// no stream.
	testenv.WaitFor(b, 60*time.Second, "the relay child to stream its slot", func() (bool, error) {
		return p.mark(b).Active, nil
	})
	return p
}

func benchCDCProcTx(b *testing.B, mode outbox.RelayMode) {
	ctx := context.Background()
	n := cdcProcEvents()
	var drain benchRate
	var sum cdcProcDelta
	for range b.N {
		e := newCDCProcEnv(b, mode, n)
		e.cfg.SampleHeap = true
		p := e.start(b, "tx")
		before := p.mark(b)
		start := time.Now()
		fill, args := bigTxTable, []any{n}
		if mode == outbox.ModeWAL {
			fill, args = benchBigTxEmitted, []any{n, outbox.EmitPrefix}
		}
		if _, err := e.pool.Exec(ctx, fill, args...); err != nil {
			b.Fatalf("committing the transaction: %v", err)
		}
		committed := time.Now()
		after := p.waitAcked(b, int64(n), 10*time.Minute)
		drained := time.Unix(0, after.DrainedAt).Sub(committed)
		drain.add(n, drained)
		b.Logf("%d events committed in one transaction in %v, drained in %v", n,
			committed.Sub(start).Round(time.Millisecond), drained.Round(time.Millisecond))
		sum.add(before, after)
		p.stop(b)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(drain.perSecond(), "events/s")
	sum.report(b, drain.events)
}

func benchCDCProcRate(b *testing.B, mode outbox.RelayMode, rate int) {
	ctx := context.Background()
	var sum cdcProcDelta
	events := 0
	for range b.N {
		warmN := int(lagWarmUp.Seconds() * float64(rate))
		n := int(lagLoad.Seconds() * float64(rate))
		e := newCDCProcEnv(b, mode, warmN+n)
		p := e.start(b, "rate")
		if _, err := benchTrickle(ctx, e.pool, mode.Write(), rate, warmN, newBenchClock()); err != nil {
			b.Fatal(err)
		}
		before := p.waitAcked(b, int64(warmN), time.Minute)
		if _, err := benchTrickle(ctx, e.pool, mode.Write(), rate, n, newBenchClock()); err != nil {
			b.Fatal(err)
		}
		after := p.waitAcked(b, int64(warmN+n), time.Minute)
		sum.add(before, after)
		events += n
		p.stop(b)
	}
	b.ReportMetric(0, "ns/op")
	sum.report(b, events)
}

func benchCDCProcIdle(b *testing.B) {
	var sum cdcProcDelta
	var idle time.Duration
	for range b.N {
		e := newCDCProcEnv(b, outbox.ModeCDC, 0)
		p := e.start(b, "idle")
		before := p.mark(b)
		start := time.Now()
		time.Sleep(3 * time.Second) //nolint:forbidigo // measuring an idle interval
		after := p.mark(b)
		idle += time.Since(start)
		sum.add(before, after)
		p.stop(b)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(sum.cpu/idle.Seconds()*1000, "cpu-ms/s")
	b.ReportMetric(float64(sum.sql)/idle.Seconds(), "sql/s")
}

// cdcProcDelta sums the phases' differences between two marks.
type cdcProcDelta struct {
	cpu, gc             float64
	bytes, objs, cycles uint64
	sql                 int64
	peakHeap, peakRSS   uint64
}

func (d *cdcProcDelta) add(before, after cdcProcStats) {
	d.cpu += after.CPUSeconds - before.CPUSeconds
	d.gc += after.GCSeconds - before.GCSeconds
	d.bytes += after.AllocBytes - before.AllocBytes
	d.objs += after.AllocObjs - before.AllocObjs
	d.cycles += after.GCCycles - before.GCCycles
	d.sql += after.SQL - before.SQL
	d.peakHeap = max(d.peakHeap, after.PeakHeap)
	d.peakRSS = max(d.peakRSS, after.PeakRSS)
}

func (d *cdcProcDelta) report(b *testing.B, events int) {
	per := func(x float64) float64 { return x / float64(events) }
	b.ReportMetric(per(d.cpu)*1e6, "cpu-µs/event")
	b.ReportMetric(per(d.gc)*1e6, "gc-cpu-µs/event")
	b.ReportMetric(per(float64(d.bytes)), "B/event")
	b.ReportMetric(per(float64(d.objs)), "allocs/event")
	b.ReportMetric(per(float64(d.sql)), "sql/event")
	b.ReportMetric(float64(d.cycles), "gc-cycles")
	if d.peakHeap > 0 {
		b.ReportMetric(float64(d.peakHeap)/(1<<20), "peak-heap-MiB")
	}
	b.ReportMetric(float64(d.peakRSS)/(1<<20), "peak-rss-MiB")
}

// TestMain runs the relay child when relayChildEnv is set, the tests
// otherwise.
func TestMain(m *testing.M) {
	if conf := os.Getenv(relayChildEnv); conf != "" {
		os.Exit(relayChild(conf))
	}
	os.Exit(m.Run())
}

// relayChild streams one slot until its stdin closes, answering each "mark"
// line with its stats (cdcProcStats) as one JSON line.
func relayChild(conf string) int {
	var cfg cdcChildConfig
	if err := json.Unmarshal([]byte(conf), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 2
	}
	signal.Ignore(syscall.SIGINT)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sql atomic.Int64
	pc, err := pgxpool.ParseConfig(cfg.DB)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 2
	}
	pc.MaxConns = 4
	pc.ConnConfig.Tracer = countingTracer{&sql}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 2
	}
	defer pool.Close()
	w := testenv.NewWriter(cfg.Brokers, outbox.DefaultBatchSize)
	defer w.Close()
	acked := &childAckWriter{w: w, want: cfg.Want}
	relay, err := outbox.NewCDCRelay(pool, acked, outbox.CDCConfig{Slot: cfg.Slot, Mode: outbox.RelayMode(cfg.Mode),
		Topic: func(string) string { return cfg.Topic }, Logger: benchLogger})
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 2
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = relay.Run(ctx) })

	// The peak heap: sampled, since the runtime keeps no high-water mark.
	var peakHeap atomic.Uint64
	wg.Go(func() {
		if !cfg.SampleHeap {
			return
		}
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > peakHeap.Load() {
				peakHeap.Store(v)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})

	profiling := false
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	stats := []metrics.Sample{
		{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/allocs:objects"}, {Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/cpu/classes/gc/total:cpu-seconds"},
	}
	for in.Scan() {
		if in.Text() != "mark" {
			continue
		}
		if cfg.CPUProfile != "" && !profiling {
			f, err := os.Create(cfg.CPUProfile)
			if err == nil && pprof.StartCPUProfile(f) == nil {
				profiling = true
				defer func() { pprof.StopCPUProfile(); f.Close() }()
			}
		}
		metrics.Read(stats)
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		s := cdcProcStats{
			Active:     relay.Active(),
			Acked:      acked.n.Load(),
			CPUSeconds: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds(),
			AllocBytes: stats[0].Value.Uint64(), AllocObjs: stats[1].Value.Uint64(), GCCycles: stats[2].Value.Uint64(),
			GCSeconds: stats[3].Value.Float64(),
			SQL:       sql.Load(),
			PeakHeap:  peakHeap.Swap(0),
			PeakRSS:   vmHWM(),
			DrainedAt: acked.drainedAt.Load(),
		}
		// Reset the high-water mark of the resident set (proc(5), clear_refs).
		_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
		line, _ := json.Marshal(s)
		out.Write(line)
		out.WriteString("\n")
		out.Flush()
	}
	cancel()
	wg.Wait()
	if cfg.MemProfile != "" {
		if f, err := os.Create(cfg.MemProfile); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}
	return 0
}

// vmHWM is the process's peak resident set in bytes.
func vmHWM() uint64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// countingTracer counts the statements a pool runs.
type countingTracer struct{ n *atomic.Int64 }

func (c countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// childAckWriter counts the events Kafka acknowledged and notes when they
// reached want.
type childAckWriter struct {
	w         outbox.Writer
	n         atomic.Int64
	want      int64
	drainedAt atomic.Int64
}

func (c *childAckWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if err := c.w.WriteMessages(ctx, msgs...); err != nil {
		return err
	}
	if n := c.n.Add(int64(len(msgs))); c.want > 0 && n >= c.want && c.drainedAt.Load() == 0 {
		c.drainedAt.Store(time.Now().UnixNano())
	}
	return nil
}

// KafkaWriter lets the relay read the writer's batch limits, as it does the
// services' writer.
func (c *childAckWriter) KafkaWriter() *kafka.Writer { return c.w.(*testenv.Writer).Writer }
