//go:build linux

package cdc_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
)

// ---------------------------------------------------------------------------
// The log-based relay as a process of its own: what it costs per event.
// ---------------------------------------------------------------------------

// BenchmarkCDCRelayProcess runs a Relay alone in a child process (this
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
//   - rate=200, rate=1000, rate=5000: one event per transaction at that
//     many commits a second for lagLoad: CPU and allocations per event at a
//     steady rate (the rates make bench -only peers compares with
//     Debezium's), and the rate the commits reached (events/s).
//   - idle: three seconds with nothing to publish.
//
// ONCEFLOW_BENCH_CDC_FLUSH_DELAY (a duration) sets the child relay's
// Config.FlushDelay, to weigh the CPU a longer wait for batch-mates saves at
// the mid rates against the latency it adds.
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
		for _, rate := range []int{200, 1000, 5000} {
			b.Run("rate="+strconv.Itoa(rate)+"/"+name, func(b *testing.B) { benchCDCProcRate(b, mode, rate) })
		}
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
			fill, args = bigTxEmitted, []any{n, cdc.EmitPrefix}
		}
		if _, err := e.pool.Exec(ctx, fill, args...); err != nil {
			b.Fatalf("committing the transaction: %v", err)
		}
		committed := time.Now()
		after := p.waitAcked(b, int64(n), 10*time.Minute)
		drained := time.Unix(0, after.DrainedAt).Sub(committed)
		drain.Add(n, drained)
		b.Logf("%d events committed in one transaction in %v, drained in %v", n,
			committed.Sub(start).Round(time.Millisecond), drained.Round(time.Millisecond))
		sum.add(before, after)
		p.stop(b)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(drain.PerSecond(), "events/s")
	sum.report(b, drain.Events)
}

func benchCDCProcRate(b *testing.B, mode outbox.RelayMode, rate int) {
	ctx := context.Background()
	var (
		sum       cdcProcDelta
		committed benchRate
	)
	events := 0
	// One connection commits a few hundred to a couple of thousand
	// transactions a second: more of them at the higher rates, so that the
	// schedule, not the commits, sets the rate.
	producers := max(lagProducers, rate/500)
	for range b.N {
		warmN := int(lagWarmUp.Seconds() * float64(rate))
		n := int(lagLoad.Seconds() * float64(rate))
		e := newCDCProcEnv(b, mode, warmN+n)
		pool := e.writers(b, producers)
		p := e.start(b, "rate"+strconv.Itoa(rate))
		if _, err := benchTrickleFrom(ctx, pool, cdc.Write(mode), rate, warmN, producers, newBenchClock()); err != nil {
			b.Fatal(err)
		}
		p.waitAcked(b, int64(warmN), time.Minute)
		before := p.mark(b)
		start := time.Now()
		if _, err := benchTrickleFrom(ctx, pool, cdc.Write(mode), rate, n, producers, newBenchClock()); err != nil {
			b.Fatal(err)
		}
		committed.Add(n, time.Since(start))
		after := p.waitAcked(b, int64(warmN+n), time.Minute)
		sum.add(before, after)
		events += n
		p.stop(b)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(committed.PerSecond(), "events/s")
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
		<-time.After(3 * time.Second) // the idle interval measured: nothing to wait for
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
	sql, writes         int64
	peakHeap, peakRSS   uint64
}

func (d *cdcProcDelta) add(before, after cdcProcStats) {
	d.cpu += after.CPUSeconds - before.CPUSeconds
	d.gc += after.GCSeconds - before.GCSeconds
	d.bytes += after.AllocBytes - before.AllocBytes
	d.objs += after.AllocObjs - before.AllocObjs
	d.cycles += after.GCCycles - before.GCCycles
	d.sql += after.SQL - before.SQL
	d.writes += after.Writes - before.Writes
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
	b.ReportMetric(per(float64(d.writes)), "writes/event") // Kafka writes: at a low rate, most of the CPU
	b.ReportMetric(float64(d.cycles), "gc-cycles")
	if d.peakHeap > 0 {
		b.ReportMetric(float64(d.peakHeap)/(1<<20), "peak-heap-MiB")
	}
	b.ReportMetric(float64(d.peakRSS)/(1<<20), "peak-rss-MiB")
}
