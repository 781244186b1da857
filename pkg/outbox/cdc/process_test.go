//go:build linux

package cdc_test

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

	"github.com/onceflow/onceflow/pkg/kafkasafe"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A Relay alone in a process of its own (this test binary, started again
// with relayChildEnv set), for what only a process can tell: its peak
// resident set, its CPU time, and the Go runtime's allocations and
// collections without the test's own. BenchmarkCDCRelayProcess and
// TestCDCRelayProcessMemoryIsBounded run it.

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
	Writes     int64   `json:"writes"` // calls of the writer
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
	FlushDelay string   `json:"flush_delay"` // Config.FlushDelay, "" for its default
	CPUProfile string   `json:"cpuprofile"`
	MemProfile string   `json:"memprofile"`
}

func startCDCProc(tb testing.TB, cfg cdcChildConfig) *cdcProc {
	tb.Helper()
	conf, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), relayChildEnv+"="+string(conf))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
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
	tb.Cleanup(func() { p.stop(tb) })
	return p
}

// mark asks the child for its stats and resets its peaks: the next
// stats' peaks are since this mark.
func (p *cdcProc) mark(tb testing.TB) cdcProcStats {
	tb.Helper()
	return p.ask(tb, "mark")
}

// peek asks the child for its stats and leaves its peaks alone.
func (p *cdcProc) peek(tb testing.TB) cdcProcStats {
	tb.Helper()
	return p.ask(tb, "peek")
}

func (p *cdcProc) ask(tb testing.TB, what string) cdcProcStats {
	tb.Helper()
	if _, err := io.WriteString(p.stdin, what+"\n"); err != nil {
		tb.Fatalf("relay child: %v", err)
	}
	select {
	case line, ok := <-p.lines:
		if !ok {
			tb.Fatalf("relay child exited: %v", <-p.waited)
		}
		var s cdcProcStats
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			tb.Fatalf("relay child said %q: %v", line, err)
		}
		return s
	case <-time.After(30 * time.Second):
		tb.Fatalf("relay child did not answer %q in 30s", what)
	}
	return cdcProcStats{}
}

// waitAcked peeks until the child acked at least n events.
func (p *cdcProc) waitAcked(tb testing.TB, n int64, timeout time.Duration) cdcProcStats {
	tb.Helper()
	var s cdcProcStats
	testenv.WaitFor(tb, timeout, fmt.Sprintf("the relay to ack %d events", n), func() (bool, error) {
		s = p.peek(tb)
		return s.Acked >= n, nil
	})
	return s
}

func (p *cdcProc) stop(tb testing.TB) {
	if p.stdin == nil {
		return
	}
	_ = p.stdin.Close()
	p.stdin = nil
	for range p.lines {
	}
	if err := <-p.waited; err != nil {
		tb.Errorf("relay child: %v", err)
	}
}

// cdcProcEnv is a database with the outbox, a topic and a slot the child
// relay created and streams.
type cdcProcEnv struct {
	pool    *pgxpool.Pool
	brokers []string
	cfg     cdcChildConfig
}

func newCDCProcEnv(tb testing.TB, mode outbox.RelayMode, want int) *cdcProcEnv {
	tb.Helper()
	brokers := testenv.KafkaBrokers(tb)
	url := testenv.NewMigratedDatabase(tb, testenv.Migration{FS: outbox.Migrations, Table: outbox.MigrationsTable})
	pool := testenv.NewPool(tb, url)
	slot := newSlot(tb, pool)
	return &cdcProcEnv{pool: pool, brokers: brokers, cfg: cdcChildConfig{
		DB: url, Brokers: brokers, Slot: slot, Topic: testenv.NewTopic(tb, brokers, 6),
		Mode: string(mode), Want: int64(want),
	}}
}

// writers is a pool of n connections to e's database, for n committing
// producers (benchTrickleFrom).
func (e *cdcProcEnv) writers(tb testing.TB, n int) *pgxpool.Pool {
	tb.Helper()
	if n <= 4 { // pgxpool's default size on a machine of few cores
		return e.pool
	}
	pc, err := pgxpool.ParseConfig(e.cfg.DB)
	if err != nil {
		tb.Fatal(err)
	}
	pc.MaxConns = int32(n)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		tb.Fatalf("opening pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// start starts the child and waits until it streams.
func (e *cdcProcEnv) start(tb testing.TB, phase string) *cdcProc {
	tb.Helper()
	cfg := e.cfg
	cfg.FlushDelay = os.Getenv("ONCEFLOW_BENCH_CDC_FLUSH_DELAY")
	if prefix := os.Getenv("ONCEFLOW_BENCH_CDC_CPUPROFILE"); prefix != "" {
		cfg.CPUProfile = fmt.Sprintf("%s-%s-%s.prof", prefix, phase, cfg.Mode)
	}
	if prefix := os.Getenv("ONCEFLOW_BENCH_CDC_MEMPROFILE"); prefix != "" {
		cfg.MemProfile = fmt.Sprintf("%s-%s-%s.mprof", prefix, phase, cfg.Mode)
	}
	p := startCDCProc(tb, cfg)
	// Streaming, not only holding the slot: a slot is active while it is
	// being created too, and what commits before its consistent point is in
	// no stream.
	testenv.WaitFor(tb, 60*time.Second, "the relay child to stream its slot", func() (bool, error) {
		return p.mark(tb).Active, nil
	})
	return p
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
// or "peek" line with its stats (cdcProcStats) as one JSON line; a mark
// then resets the peaks.
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
	// The services' relay writer (platform/kafkautil.RelayBatchSize), which
	// make bench -only peers runs beside Debezium: kafka-go allocates room
	// for its BatchSize messages in every partition's record batch.
	w := testenv.NewWriter(cfg.Brokers, kafkasafe.DefaultBatchSize)
	defer w.Close()
	acked := &childAckWriter{w: w, want: cfg.Want}
	var flush time.Duration
	if cfg.FlushDelay != "" {
		if flush, err = time.ParseDuration(cfg.FlushDelay); err != nil {
			fmt.Fprintln(os.Stderr, "relay child: ONCEFLOW_BENCH_CDC_FLUSH_DELAY:", err)
			return 2
		}
	}
	relay, err := cdc.NewRelay(pool, acked, cdc.Config{Slot: cfg.Slot, Mode: outbox.RelayMode(cfg.Mode),
		Topic: func(string) string { return cfg.Topic }, Logger: benchLogger, FlushDelay: flush})
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
		cmd := in.Text()
		if cmd != "mark" && cmd != "peek" {
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
			Writes:     acked.calls.Load(),
			CPUSeconds: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds(),
			AllocBytes: stats[0].Value.Uint64(), AllocObjs: stats[1].Value.Uint64(), GCCycles: stats[2].Value.Uint64(),
			GCSeconds: stats[3].Value.Float64(),
			SQL:       sql.Load(),
			PeakHeap:  peakHeap.Load(),
			PeakRSS:   vmHWM(),
			DrainedAt: acked.drainedAt.Load(),
		}
		if cmd == "mark" {
			peakHeap.Store(0)
			// Reset the high-water mark of the resident set (proc(5), clear_refs).
			_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
		}
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
	n, calls  atomic.Int64
	want      int64
	drainedAt atomic.Int64
}

func (c *childAckWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	c.calls.Add(1)
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

// relayRSSBound bounds the log-based relay's resident set while it drains
// one big transaction, whatever its size: the Go runtime, the relay's
// connections and what is in flight to Kafka (Config.MaxInFlight events
// per topic, kafka-go's batches), never the transaction. Alone on a quiet
// machine the relay peaks near 35 MiB (issue 23's goal is 64); under make
// test, beside every other package's tests on two cores, its garbage
// collector falls behind and the resident set reached 79-81 MiB with a
// peak heap of 11 MiB. A relay that held the transaction reaches 171-184
// MiB: the bound sits between, so that this fails on that and not on load.
const relayRSSBound = 128 << 20

// The relay's memory does not grow with a transaction's size: a relay alone
// in its process drains a transaction of bigTxEvents (100,000 by default
// here, ONCEFLOW_TEST_CDC_BIG_TX_EVENTS for the long run) in table mode and
// WAL-only mode, committed while it streams, within relayRSSBound of
// resident memory. (TestCDCLargeTransactionMemoryIsBounded watches the
// heap of a relay in the test's own process.)
func TestCDCRelayProcessMemoryIsBounded(t *testing.T) {
	n := 100_000
	if os.Getenv("ONCEFLOW_TEST_CDC_BIG_TX_EVENTS") != "" {
		n = bigTxEvents(t)
	}
	for _, mode := range []outbox.RelayMode{outbox.ModeCDC, outbox.ModeWAL} {
		t.Run(string(mode), func(t *testing.T) {
			e := newCDCProcEnv(t, mode, n)
			e.cfg.SampleHeap = true
			p := e.start(t, "memory")
			p.mark(t) // from here on
			fill, args := bigTxTable, []any{n}
			if mode == outbox.ModeWAL {
				fill, args = bigTxEmitted, []any{n, cdc.EmitPrefix}
			}
			if _, err := e.pool.Exec(context.Background(), fill, args...); err != nil {
				t.Fatalf("committing the transaction: %v", err)
			}
			s := p.waitAcked(t, int64(n), 5*time.Minute)
			t.Logf("%s: %d events in one transaction drained; peak RSS %.1f MiB (bound %d), peak heap %.1f MiB",
				mode, n, float64(s.PeakRSS)/(1<<20), relayRSSBound>>20, float64(s.PeakHeap)/(1<<20))
			if s.PeakRSS > relayRSSBound {
				t.Errorf("the relay's resident set reached %.1f MiB draining one %d-event transaction, over the %d MiB bound",
					float64(s.PeakRSS)/(1<<20), n, relayRSSBound>>20)
			}
		})
	}
}
