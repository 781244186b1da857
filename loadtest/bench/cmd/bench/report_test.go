package main

import (
	"strings"
	"testing"

	"github.com/onceflow/onceflow/loadtest/bench/rig"
)

// cells splits a markdown table row into its cells.
func cells(line string) []string {
	parts := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// rowOf finds the row of table whose first cell starts with label.
func rowOf(t *testing.T, table, label string) []string {
	t.Helper()
	for _, line := range strings.Split(table, "\n") {
		if c := cells(line); len(c) > 0 && strings.HasPrefix(c[0], label) {
			return c
		}
	}
	t.Fatalf("no row %q in:\n%s", label, table)
	return nil
}

// Each value sits under its own column: measured / baseline / ratio hold a
// measured value, its baseline and their ratio, never a p50 under
// "baseline" and a p99 under "ratio".
func TestResultsTableKeepsValuesUnderTheirColumns(t *testing.T) {
	res := Results{
		Go: map[string]GoBench{
			"cdc-lag-wal": {Metrics: map[string]float64{"events/s": 1000, "ack-p50-ms": 2.1, "ack-p99-ms": 4.2}},
		},
		K6: map[string]rig.Report{"outbox": {OfferedRate: 1000, OrdersPerSecond: 827, LagP50Ms: 336, LagP99Ms: 643}},
	}
	table := resultsTable(res)
	header := cells(strings.SplitN(table, "\n", 2)[0])
	if want := []string{"comparison", "measured", "baseline", "ratio", "goal", ""}; strings.Join(header, ",") != strings.Join(want, ",") {
		t.Fatalf("header %q, want %q", header, want)
	}
	for _, line := range strings.Split(table, "\n")[2:] {
		c := cells(line)
		if len(c) < 6 {
			continue
		}
		if strings.Contains(c[2], "p50") || strings.Contains(c[2], "p99") || strings.Contains(c[3], "p99") ||
			strings.Contains(c[3], "ms") || strings.Contains(c[3], "/s") {
			t.Errorf("a value under the wrong column: %q", line)
		}
	}
	if r := rowOf(t, table, "steady 1,000 orders/s (outbox): commit → settlement p99"); r[1] != "643 ms" || r[5] != "**missed**" {
		t.Errorf("steady p99 row = %q, want 643 ms, missed", r)
	}
}

// A row is "met" only when every goal of its section is: a drain of 28,714
// events/s meets "≥ 20,000 events/s" but its ratio of 0.15 misses "ratio ≥
// 0.50", so the row is missed.
func TestMetNeedsTheRatioGoalToo(t *testing.T) {
	res := Results{Go: map[string]GoBench{
		"drain":   {Metrics: map[string]float64{"events": 100000, "relay-events/s": 28714, "raw-events/s": 188748, "ratio": 0.15}},
		"consume": {Metrics: map[string]float64{"dup-events/s": 9000, "clean-events/s": 12000, "ratio": 0.75}},
	}}
	table := resultsTable(res)
	if r := rowOf(t, table, "relay drain"); r[4] != "≥ 20,000 events/s and ratio ≥ 0.50" || r[5] != "**missed**" {
		t.Errorf("drain row = %q, want both goals and missed", r)
	}
	if r := rowOf(t, table, "billing consumption"); r[4] != "clean ≥ 10,000 events/s and ratio ≥ 0.90" || r[5] != "**missed**" {
		t.Errorf("consumption row = %q, want both goals and missed", r)
	}
}

// A run is quiet only when the load averages at its start say so: a quarter
// of the CPUs or less over 1, 5 and 15 minutes. 4.89 / 10.00 on 2 CPUs is
// not quiet, and the report says so instead of calling it quiet.
func TestQuietOnlyWhenTheLoadAtStartSaysSo(t *testing.T) {
	for _, tt := range []struct {
		load  string
		cpus  int
		quiet bool
	}{
		{"0.10 0.20 0.30", 2, true},
		{"0.50 0.50 0.50", 2, true},
		{"0.20 0.30 0.60", 2, false}, // the 15-minute average: a run just ended
		{"4.89 10.00 6.20", 2, false},
		{"3.00 3.00 3.00", 16, true},
		{"", 2, false}, // unknown is not quiet
		{"x y z", 2, false},
	} {
		quiet, why := quietness(tt.load, tt.cpus)
		if quiet != tt.quiet || why == "" {
			t.Errorf("quietness(%q, %d) = %v %q, want %v with a reason", tt.load, tt.cpus, quiet, why, tt.quiet)
		}
	}
	md := markdown(Results{Machine: Machine{CPUs: 2, Load: "4.89 10.00 6.20", Date: "d"}}, options{}, "")
	if !strings.Contains(md, "Not a quiet machine") || strings.Contains(md, "on a quiet machine") {
		t.Errorf("the report of a busy start:\n%s", md)
	}
}
