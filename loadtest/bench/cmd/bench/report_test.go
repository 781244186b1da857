package main

import (
	"strings"
	"testing"
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
// "baseline" and a p99 under "ratio"; and the detail tables judge no goal
// (goals.go's are judged once, in the headline).
func TestLibraryTableKeepsValuesUnderTheirColumns(t *testing.T) {
	res := Results{Go: map[string]GoBench{
		"write": {Metrics: map[string]float64{"outbox-tx/s": 6073, "bare-tx/s": 10578, "ratio": 0.574, "outbox-p99-ms": 3.1, "bare-p99-ms": 1.8}},
		"drain": {Metrics: map[string]float64{"events": 100000, "relay-events/s": 28714, "raw-events/s": 188748, "ratio": 0.15}},
	}}
	table := libraryTable(res)
	header := cells(strings.SplitN(table, "\n", 2)[0])
	if want := []string{"benchmark", "measured", "baseline", "ratio"}; strings.Join(header, ",") != strings.Join(want, ",") {
		t.Fatalf("header %q, want %q", header, want)
	}
	for _, line := range strings.Split(table, "\n")[2:] {
		c := cells(line)
		if len(c) < 4 {
			continue
		}
		if strings.Contains(c[3], "ms") || strings.Contains(c[3], "/s") {
			t.Errorf("a value under the wrong column: %q", line)
		}
	}
	if r := rowOf(t, table, "relay drain"); r[1] != "28,714 events/s" || r[2] != "188,748 events/s" || r[3] != "0.15" {
		t.Errorf("drain row = %q", r)
	}
	if r := rowOf(t, table, "billing consumption"); r[1] != "not run" {
		t.Errorf("consumption row = %q, want not run", r)
	}
	if strings.Contains(table, "met") || strings.Contains(table, "≥") {
		t.Errorf("the detail table judges a goal:\n%s", table)
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
	md := headlineMarkdown(headlineInput{res: Results{Machine: Machine{CPUs: 2, Load: "4.89 10.00 6.20", Date: "d"}}})
	if !strings.Contains(md, "| quiet | **no**: 1-minute load 4.89 at start") || strings.Contains(md, "| quiet | yes") {
		t.Errorf("the headline of a busy start:\n%s", md)
	}
	md = headlineMarkdown(headlineInput{res: Results{Machine: Machine{CPUs: 2, Load: "0.10 0.20 0.30", Date: "d"}}})
	if !strings.Contains(md, "| quiet | yes: load 0.10 / 0.20 / 0.30") {
		t.Errorf("the headline of a quiet start:\n%s", md)
	}
}
