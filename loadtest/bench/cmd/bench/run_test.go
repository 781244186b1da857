package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/loadtest/bench/rig"
)

func TestParseBenchLine(t *testing.T) {
	for _, c := range []struct {
		line    string
		name    string
		metrics map[string]float64
	}{
		{"BenchmarkEnqueueOverhead/workers=8-2   \t 1\t 2.054 bare-p50-ms\t 2042 bare-tx/s\t 0.2478 ratio",
			"BenchmarkEnqueueOverhead/workers=8", map[string]float64{"bare-p50-ms": 2.054, "bare-tx/s": 2042, "ratio": 0.2478}},
		{"BenchmarkConsume-2 1 1880 clean-events/s 1.06 ratio",
			"BenchmarkConsume", map[string]float64{"clean-events/s": 1880, "ratio": 1.06}},
		{"BenchmarkRelayDrain/batch=1000/writer-BatchSize=100-2 1 22000 relay-events/s",
			"BenchmarkRelayDrain/batch=1000/writer-BatchSize=100", map[string]float64{"relay-events/s": 22000}},
		{"--- BENCH: BenchmarkConsume-2", "", nil},
		{"    bench_test.go:65: 22000 deliveries", "", nil},
		{"PASS", "", nil},
	} {
		name, m, ok := parseBenchLine(c.line)
		if ok != (c.name != "") || name != c.name || len(m) != len(c.metrics) {
			t.Errorf("parseBenchLine(%q) = %q, %v, %v; want %q, %v", c.line, name, m, ok, c.name, c.metrics)
			continue
		}
		for k, v := range c.metrics {
			if m[k] != v {
				t.Errorf("parseBenchLine(%q)[%s] = %v, want %v", c.line, k, m[k], v)
			}
		}
	}
}

func TestWriteMarkdownKeepsTheHandWrittenParts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	if err := os.WriteFile(path, []byte("# Notes\n\nhand-written\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"first", "second"} {
		section := beginMarker + "\n" + run + " run\n" + endMarker + "\n"
		if err := writeMarkdown(path, section, beginMarker, endMarker); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	want := "# Notes\n\nhand-written\n\n" + beginMarker + "\nsecond run\n" + endMarker + "\n"
	if got != want {
		t.Fatalf("after two runs the file is\n%s\nwant\n%s", got, want)
	}
	if strings.Count(got, beginMarker) != 1 {
		t.Fatalf("the generated section appears %d times", strings.Count(got, beginMarker))
	}
}

func TestQuantileAndCommas(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for q, want := range map[float64]float64{0: 1, 0.5: 5, 0.99: 10, 1: 10} {
		if got := quantile(v, q); got != want {
			t.Errorf("quantile(1..10, %v) = %v, want %v", q, got, want)
		}
	}
	for in, want := range map[string]string{"0": "0", "999": "999", "1000": "1,000", "1234567": "1,234,567", "-20000": "-20,000"} {
		if got := commas(in); got != want {
			t.Errorf("commas(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLagSVGPlotsEverySecond(t *testing.T) {
	series := []LagPoint{{Second: 0, Orders: 10, P50Ms: 20, P99Ms: 80, MaxMs: 90}, {Second: 1, Orders: 10, P50Ms: 25, P99Ms: 150, MaxMs: 400}}
	svg := lagSVG(series, "lag <test>")
	if !strings.HasPrefix(svg, "<svg") || !strings.Contains(svg, "lag &lt;test&gt;") {
		t.Fatalf("not an SVG with the escaped title:\n%s", svg)
	}
	if n := strings.Count(svg, "<polyline"); n != 3 {
		t.Fatalf("%d lines, want p50, p99 and max", n)
	}
	if !strings.Contains(svg, "p99 goal 100 ms") {
		t.Fatal("the 100 ms goal line is missing")
	}
}

func TestBrokeInvariant(t *testing.T) {
	for _, c := range []struct {
		failed []string
		want   bool
	}{
		{[]string{"settle_lag: p(99)<=1000"}, false},
		{[]string{"orders_unsettled: max<=6000", "settle_lag: p(99)<=1000"}, false},
		{[]string{"settle_lag: p(99)<=1000", "settlements_lost: count==0"}, true},
		{[]string{"settlements_duplicated: count==0"}, true},
		{nil, true}, // k6 failed without a threshold: something else broke
	} {
		if got := brokeInvariant(rig.Report{ThresholdsFailed: c.failed}); got != c.want {
			t.Errorf("brokeInvariant(%q) = %v, want %v", c.failed, got, c.want)
		}
	}
}

func TestCDCRows(t *testing.T) {
	res := Results{Go: map[string]GoBench{}}
	lines := []string{
		"BenchmarkCDCWriteOverhead/mode=poll-2 1 0 ns/op 1000 bare-tx/s 560 event-tx/s 0.56 ratio 310 wal-bytes/event",
		"BenchmarkCDCWriteOverhead/mode=table-2 1 0 ns/op 1000 bare-tx/s 800 event-tx/s 0.80 ratio 305 wal-bytes/event",
		"BenchmarkCDCWriteOverhead/mode=wal-2 1 0 ns/op 1000 bare-tx/s 900 event-tx/s 0.90 ratio 420 wal-bytes/event",
		"BenchmarkCDCDrain/mode=poll-2 1 0 ns/op 3000 relay-events/s 20000 raw-events/s 0.15 ratio 1000 events",
		"BenchmarkCDCDrain/mode=table-2 1 0 ns/op 12000 relay-events/s 20000 raw-events/s 0.60 ratio 1000 events",
		"BenchmarkCDCPublishLag/mode=wal-2 1 0 ns/op 999 events/s 2.1 ack-p50-ms 7.5 ack-p99-ms",
	}
	for _, l := range lines {
		name, m, ok := parseBenchLine(l)
		if !ok {
			t.Fatalf("parseBenchLine(%q) failed", l)
		}
		res.Go[cdcKey(name)] = GoBench{Name: name, Metrics: m}
	}
	for _, key := range []string{"cdc-write-poll", "cdc-write-table", "cdc-write-wal", "cdc-drain-poll", "cdc-drain-table", "cdc-lag-wal"} {
		if _, ok := res.Go[key]; !ok {
			t.Errorf("no result under %s; have %v", key, res.Go)
		}
	}
	table := modesTable(res)
	for _, want := range []string{
		"| figure | poll | cdc (table) | wal |",
		"| write: order + event ÷ bare order insert (tx/s) | 0.56 (560 / 1,000) | 0.80 (800 / 1,000) | 0.90 (900 / 1,000) |",
		"| WAL bytes per event (write phase, over the bare insert's) | 310 B | 305 B | 420 B |",
		"| drain of a backlog ÷ raw kafka-go produce (events/s) | 0.15 (3,000 / 20,000 of 1,000) | 0.60 (12,000 / 20,000 of 1,000) | not run |",
		"| commit → Kafka ack at a steady rate: p50 / p99 | not run | not run | 2.1 / 7.5 ms at 999/s |",
	} {
		requireRow(t, "the table", table, want)
	}
	if modesTable(Results{}) != "" {
		t.Error("a modes table without the cdc part")
	}
}

func TestParseFlagsCDC(t *testing.T) {
	o, err := parseFlags([]string{"bench"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.only["cdc"] || o.drainEvents != 100_000 {
		t.Errorf("defaults: only %v, drain-events %d; want cdc among the parts and 100,000", o.only, o.drainEvents)
	}
	o, err = parseFlags([]string{"bench", "-only", "cdc", "-drain-events", "500"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.only) != 1 || !o.only["cdc"] || o.drainEvents != 500 {
		t.Errorf("-only cdc -drain-events 500: only %v, drain-events %d", o.only, o.drainEvents)
	}
	if _, err := parseFlags([]string{"bench", "-drain-events", "0"}, io.Discard); err == nil {
		t.Error("-drain-events 0 was accepted")
	}
}
