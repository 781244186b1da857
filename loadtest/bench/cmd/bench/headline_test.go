package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/loadtest/bench/rig"
)

// headlineFixture is one run of every main part and the peers part: the
// ramp on both sides (with base), each library benchmark, and the peers'
// CPU per event at each goal rate.
func headlineFixture(base bool) Results {
	ramp := func(side string, knee, settled, programs, allButK6, k6 float64) Run {
		return Run{Key: "ramp", Side: side, K6: rig.Report{Knee: knee}, Windows: []Window{
			{Rate: 1000, CPUPerOrderUs: map[string]float64{cpuPrograms: programs, cpuAllButK6: allButK6, "k6": k6}},
			{Rate: 2000, SettledPerSecond: settled},
		}}
	}
	res := Results{
		Machine: Machine{Date: "2026-12-01 03:00:00 UTC", CPUs: 2, CPUModel: "AMD EPYC", MemoryGB: 23.5, Load: "0.10 0.20 0.30",
			Go: "go1.26.8", Postgres: "PostgreSQL 15.18 (Debian) on x86_64", Kafka: "3.9.1", FsyncPerSec: 10500},
		Started:  time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC),
		Seconds:  1320,
		Revision: "0123456789ab",
		Parts:    []string{"write", "drain", "consume", "cdc", "modes", "ramp", "spike", "soak", "peers"},
		Go: map[string]GoBench{
			"write":           {Metrics: map[string]float64{"outbox-tx/s": 6000, "bare-tx/s": 10000, "ratio": 0.6}},
			"drain":           {Metrics: map[string]float64{"relay-events/s": 150000, "raw-events/s": 300000, "ratio": 0.5}},
			"cdc-drain-table": {Metrics: map[string]float64{"relay-events/s": 150000, "raw-events/s": 300000, "ratio": 0.5}},
			"cdc-drain-wal":   {Metrics: map[string]float64{"relay-events/s": 240000, "raw-events/s": 300000, "ratio": 0.8}},
		},
		// Two rounds of this tree: figures are their means.
		Runs: []Run{ramp("", 800, 1600, 500, 1100, 250), ramp("", 700, 1400, 700, 1300, 250)},
	}
	if base {
		res.Base = "3ca971bf5542f317cf0e211444f858b07b93e558"
		res.Runs = append(res.Runs, ramp("base", 400, 1000, 800, 1700, 270))
	}
	paced := func(cpu200, cpu1000, cpu5000 float64) []PeerPaced {
		return []PeerPaced{{Rate: 200, RelayCPU: cpu200}, {Rate: 1000, RelayCPU: cpu1000}, {Rate: 5000, RelayCPU: cpu5000}}
	}
	res.Peers = []PeerRun{
		{Relay: "debezium", Paced: paced(400, 100, 50)},
		{Relay: "cdc", Paced: paced(100, 40, 20)},
		{Relay: "wal", Paced: paced(150, 60, 20)},
	}
	return res
}

// headlineRow1 is the headline row whose figure starts with figure.
func headlineRow1(t *testing.T, rows []headlineRow, figure string) headlineRow {
	t.Helper()
	for _, r := range rows {
		if strings.HasPrefix(r.figure, figure) {
			return r
		}
	}
	t.Fatalf("no headline row %q in %+v", figure, rows)
	return headlineRow{}
}

func TestHeadlineWithABase(t *testing.T) {
	res := headlineFixture(true)
	rows := headlineRows(headlineInput{res: res, ran: ranParts(res)})
	for _, want := range []headlineRow{
		{"knee: highest ramp step", "750 orders/s", "400 orders/s (BASE 3ca971bf5542)", "1.88×", "≥ 700 orders/s", "met"},
		// 2 CPUs × 1e6 µs ÷ (1,200 µs all but k6 + 250 µs k6) = 1,379 orders/s; 750 ÷ 1,379 = 0.54.
		{"knee ÷ the CPU bound", "750 orders/s", "1,379 orders/s (CPU bound)", "0.54", "≥ 0.75 of the CPU bound", "**missed**"},
		{"2,000 orders/s offered: settled", "1,500 orders/s", "1,000 orders/s (BASE 3ca971bf5542)", "1.50×", "≥ 1,500 orders/s", "met"},
		{"CPU per order at 1,000 orders/s: the four programs", "600 µs", "800 µs (BASE 3ca971bf5542)", "0.75×", "≤ 600 µs", "met"},
		{"CPU per order at 1,000 orders/s: everything but k6", "1,200 µs", "1,700 µs (BASE 3ca971bf5542)", "0.71×", "≤ 1,200 µs", "met"},
		{"write path", "6,000 tx/s", "10,000 tx/s (bare insert)", "0.60", "reported", ""},
		{"polling relay", "150,000 events/s", "300,000 events/s (raw produce)", "0.50", "ratio ≥ 0.40", "met"},
		{"log-based relay, table mode", "150,000 events/s", "300,000 events/s (raw produce)", "0.50", "ratio ≥ 0.60", "**missed**"},
		{"log-based relay, WAL-only", "240,000 events/s", "300,000 events/s (raw produce)", "0.80", "reported", ""},
		// Met only when both modes are: wal's 150 µs is 0.38× at 200/s, cdc's 0.25×.
		{"log-based relay CPU per event ÷ Debezium's, paced 200 events/s", "cdc 100 µs / wal 150 µs", "400 µs (Debezium)", "0.25× / 0.38×", "≤ 0.50× Debezium's", "met"},
		{"log-based relay CPU per event ÷ Debezium's, paced 1,000 events/s", "cdc 40 µs / wal 60 µs", "100 µs (Debezium)", "0.40× / 0.60×", "≤ 0.50× Debezium's", "**missed**"},
		{"log-based relay CPU per event ÷ Debezium's, paced 5,000 events/s", "cdc 20 µs / wal 20 µs", "50 µs (Debezium)", "0.40× / 0.40×", "≤ 0.50× Debezium's", "met"},
		{"settlements lost / duplicated", "0 / 0", "0 / 0 (BASE 3ca971bf5542)", "", "0 / 0", "met"},
	} {
		if got := headlineRow1(t, rows, want.figure); got.measured != want.measured || got.baseline != want.baseline ||
			got.ratio != want.ratio || got.goal != want.goal || got.verdict != want.verdict {
			t.Errorf("row %q:\n got %+v\nwant %+v", want.figure, got, want)
		}
	}
	md := headlineMarkdown(headlineInput{res: res, ran: ranParts(res)})
	for _, want := range []string{
		headlineBeginMarker + "\n## The latest `make bench` (generated)\n",
		"| run | 2026-12-01 03:00:00 UTC, 22.0 minutes, the tree at `0123456789ab` |",
		"| machine | 2 CPUs (AMD EPYC), 23.5 GiB; `pg_test_fsync` fdatasync 10,500/s; go1.26.8; PostgreSQL 15.18 (Debian); Kafka 3.9.1 |",
		"| quiet | yes: load 0.10 / 0.20 / 0.30 (1/5/15 min) at start",
		"| BASE | `3ca971bf5542f317cf0e211444f858b07b93e558` (`-base`)",
		"| parts | write, drain, consume, cdc, modes, ramp, spike, soak, peers; not run: knobs |",
		"| figure | measured | same-run baseline | ratio | goal | |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the headline lacks %q:\n%s", want, md)
		}
	}
	if !strings.HasSuffix(md, headlineEndMarker+"\n") {
		t.Errorf("the headline does not end with its marker:\n%s", md)
	}
}

func TestHeadlineWithoutABase(t *testing.T) {
	res := headlineFixture(false)
	rows := headlineRows(headlineInput{res: res, ran: ranParts(res)})
	for _, figure := range []string{"knee: highest ramp step", "2,000 orders/s offered", "CPU per order at 1,000 orders/s: the four programs", "settlements lost"} {
		if r := headlineRow1(t, rows, figure); r.baseline != "no `-base`" || r.ratio != "" {
			t.Errorf("row %q without a base: %+v", figure, r)
		}
	}
	// The CPU bound and the library benchmarks have their baselines anyway.
	if r := headlineRow1(t, rows, "knee ÷ the CPU bound"); r.baseline != "1,379 orders/s (CPU bound)" {
		t.Errorf("the CPU bound without a base: %+v", r)
	}
	if r := headlineRow1(t, rows, "polling relay"); r.ratio != "0.50" {
		t.Errorf("the drain without a base: %+v", r)
	}
	if md := headlineMarkdown(headlineInput{res: res, ran: ranParts(res)}); !strings.Contains(md, "| BASE | none") {
		t.Errorf("the headline does not say there was no base:\n%s", md)
	}
}

// A part this invocation did not run says so in its rows, with no number
// from another run; a part that ran and gave nothing says it failed.
func TestHeadlineWithPartsMissing(t *testing.T) {
	res := headlineFixture(true)
	res.Parts = []string{"write", "drain"}
	res.Runs, res.Peers = nil, nil
	delete(res.Go, "drain")
	delete(res.Go, "cdc-drain-table")
	delete(res.Go, "cdc-drain-wal")
	in := headlineInput{res: res, ran: ranParts(res), latestPeers: "2026-11-25 04:48:01 UTC"}
	rows := headlineRows(in)
	for figure, want := range map[string]string{
		"knee: highest ramp step":         "not run in this invocation (`-only` without ramp)",
		"knee ÷ the CPU bound":            "not run in this invocation (`-only` without ramp)",
		"2,000 orders/s offered: settled": "not run in this invocation (`-only` without ramp)",
		"log-based relay, table mode":     "not run in this invocation (`-only` without cdc)",
		"polling relay":                   "no result: the part failed (see Problems)",
		"settlements lost / duplicated":   "not run in this invocation (`-only` without modes, ramp, spike or soak)",
	} {
		if r := headlineRow1(t, rows, figure); r.measured != want || r.baseline != "" || r.ratio != "" {
			t.Errorf("row %q: %+v, want measured %q and no baseline or ratio", figure, r, want)
		}
	}
	peers := headlineRow1(t, rows, "log-based relay CPU per event")
	if peers.figure != "log-based relay CPU per event ÷ Debezium's, paced 200 / 1,000 / 5,000 events/s" ||
		!strings.HasPrefix(peers.measured, "not run in this invocation; the latest peers run: 2026-11-25 04:48:01 UTC") {
		t.Errorf("the peers row without the part: %+v", peers)
	}
	if r := headlineRow1(t, rows, "write path"); r.measured != "6,000 tx/s" {
		t.Errorf("the part that ran: %+v", r)
	}
	md := headlineMarkdown(in)
	if !strings.Contains(md, "| parts | write, drain; not run: consume, cdc, modes, ramp, spike, soak, knobs, peers |") {
		t.Errorf("the headline's parts:\n%s", md)
	}
}

// A peers run from before per-rate CPU: one row over the paced phases
// together, missed when a mode is above the goal there (then it is at some
// rate), never met.
func TestHeadlinePeersWithoutPerRateCPU(t *testing.T) {
	res := headlineFixture(false)
	res.Peers = []PeerRun{
		{Relay: "debezium", RelayCPUPaced: 300, Paced: []PeerPaced{{Rate: 200}, {Rate: 1000}}},
		{Relay: "cdc", RelayCPUPaced: 245, Paced: []PeerPaced{{Rate: 200}, {Rate: 1000}}},
		{Relay: "wal", RelayCPUPaced: 230, Paced: []PeerPaced{{Rate: 200}, {Rate: 1000}}},
	}
	r := headlineRow1(t, headlineRows(headlineInput{res: res, ran: ranParts(res)}), "log-based relay CPU per event")
	if !strings.Contains(r.figure, "phases 200 + 1,000 events/s together") || r.ratio != "0.82× / 0.77×" || r.verdict != "**missed**" {
		t.Errorf("the phases together, above the goal: %+v", r)
	}
	res.Peers[1].RelayCPUPaced, res.Peers[2].RelayCPUPaced = 100, 120
	r = headlineRow1(t, headlineRows(headlineInput{res: res, ran: ranParts(res)}), "log-based relay CPU per event")
	if r.verdict != "n/a" {
		t.Errorf("the phases together, below the goal, judged: %+v", r)
	}
	// A goal rate the run's -peers-rates left out.
	res = headlineFixture(false)
	for i := range res.Peers {
		res.Peers[i].Paced = res.Peers[i].Paced[:2]
	}
	r = headlineRow1(t, headlineRows(headlineInput{res: res, ran: ranParts(res)}), "log-based relay CPU per event ÷ Debezium's, paced 5,000")
	if r.measured != "not run in this invocation (`-peers-rates`)" {
		t.Errorf("a rate not run: %+v", r)
	}
}

// Results written before Parts existed tell their parts by what they hold.
func TestRanPartsOfAnOlderRun(t *testing.T) {
	ran := ranParts(Results{Go: map[string]GoBench{"write": {}, "cdc-drain-wal": {}}, Runs: []Run{{Key: "naive"}, {Key: "ramp"}}})
	for _, p := range []string{"write", "cdc", "modes", "ramp"} {
		if !ran[p] {
			t.Errorf("%s not among %v", p, ran)
		}
	}
	for _, p := range []string{"drain", "spike", "peers", "knobs"} {
		if ran[p] {
			t.Errorf("%s among %v", p, ran)
		}
	}
}

// The headline goes right under the page's title the first time, and is
// replaced in place after that; the hand-written rest stays.
func TestWriteHeadlineIsTheFirstScreen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	if err := os.WriteFile(path, []byte("# Benchmarks\n\n## Method\n\nhand-written\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"first", "second"} {
		if err := writeHeadline(path, headlineBeginMarker+"\n"+run+" run\n"+headlineEndMarker+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "# Benchmarks\n\n" + headlineBeginMarker + "\nsecond run\n" + headlineEndMarker + "\n\n## Method\n\nhand-written\n"
	if string(b) != want {
		t.Fatalf("the page is\n%s\nwant\n%s", b, want)
	}
}

// -from writes the page's sections and keeps each in the history, with the
// links made to work from there and the history's index listing it; the
// JSON it read is left alone.
func TestRewriteFromJSONKeepsTheRunInTheHistory(t *testing.T) {
	root := t.TempDir()
	res := headlineFixture(true)
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	for path, content := range map[string]string{
		"benchmarks/results.json":          string(b),
		"BENCHMARKS.md":                    "# Benchmarks\n\n## Method\n\nhand-written\n",
		"benchmarks/history/README.md":     "# History\n\n" + historyIndexBeginMarker + "\n" + historyIndexEndMarker + "\n",
		"benchmarks/history/2026-11-22.md": "# a hand-written run\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o, err := parseFlags([]string{"bench", "-root", root, "-from", "benchmarks/results.json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t.Context(), []string{"bench", "-root", root, "-from", "benchmarks/results.json"}, func(string) string { return "" }, io.Discard); err != nil {
		t.Fatal(err)
	}
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	page := read("BENCHMARKS.md")
	for _, want := range []string{"# Benchmarks\n\n" + headlineBeginMarker, "## Method\n\nhand-written\n", beginMarker, peersBeginMarker,
		"[`benchmarks/results.json`](benchmarks/results.json)"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
	kept := read("benchmarks/history/2026-12-01-0300-make-bench.md")
	for _, want := range []string{"# `make bench`, 2026-12-01 03:00:00 UTC (generated)\n",
		"[`benchmarks/results.json`](../../benchmarks/results.json)", "[Method](../../BENCHMARKS.md#method)",
		"| knee: highest ramp step"} {
		if !strings.Contains(kept, want) {
			t.Errorf("the history's copy lacks %q:\n%s", want, kept)
		}
	}
	if strings.Contains(kept, "<!-- make bench") {
		t.Errorf("the history's copy has the page's markers:\n%s", kept)
	}
	index := read("benchmarks/history/README.md")
	for _, want := range []string{
		"- [2026-12-01-0300-peers.md](2026-12-01-0300-peers.md): `make bench -only peers`, 2026-12-01 03:00:00 UTC (generated)\n",
		"- [2026-12-01-0300-make-bench.md](2026-12-01-0300-make-bench.md): `make bench`, 2026-12-01 03:00:00 UTC (generated)\n",
	} {
		if !strings.Contains(index, want) {
			t.Errorf("the history's index lacks %q:\n%s", want, index)
		}
	}
	if strings.Contains(index, "2026-11-22.md") {
		t.Errorf("the index lists a hand-written file:\n%s", index)
	}
	if got := read(o.jsonOut); got != string(b) {
		t.Error("-from rewrote the JSON it read")
	}
}

// A peers run on its own leaves the headline, one run's, as it was, but
// the date its peers row points to becomes the new run's.
func TestNotePeersRunUpdatesTheHeadlinesPointer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	res := headlineFixture(false)
	res.Peers, res.Parts = nil, res.Parts[:len(res.Parts)-1] // all but peers
	headline := headlineMarkdown(headlineInput{res: res, ran: ranParts(res), latestPeers: "2026-11-25 04:48:01 UTC"})
	if err := writeHeadline(path, headline); err != nil {
		t.Fatal(err)
	}
	if err := notePeersRun(path, "2026-12-02 10:00:00 UTC"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := "not run in this invocation; the latest peers run: 2026-12-02 10:00:00 UTC ([its section]("; !strings.Contains(string(b), want) {
		t.Errorf("the page lacks %q:\n%s", want, b)
	}
	if strings.Contains(string(b), "2026-11-25") {
		t.Errorf("the old date is still there:\n%s", b)
	}
}
