package main

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/loadtest/bench/rig"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// The relay's counters are what the bench's samples keep.
func TestRelayFamily(t *testing.T) {
	for name, want := range map[string]bool{"outbox_published_total": true, "outbox_relay_claims_total": true,
		"outbox_relay_db_roundtrips_total": true, "outbox_pending_events": false, "go_goroutines": false} {
		if relayFamily(name) != want {
			t.Errorf("relayFamily(%q) = %v, want %v", name, !want, want)
		}
	}
}

// samplesOf builds two-key samples: "orders" CPU and an orders counter, at
// t0 + i seconds.
func samplesOf(t0 time.Time, cpu []time.Duration, published, claims, trips []float64) []sample {
	var out []sample
	for i := range cpu {
		s := sample{at: t0.Add(time.Duration(i) * time.Second), cpu: map[string]time.Duration{}, counters: map[string]float64{}}
		for _, g := range append(append([]string{}, programGroups...), "postgres", "kafka") {
			s.cpu[g] = cpu[i]
		}
		s.counters["orders:outbox_published_total"] = published[i]
		if claims != nil {
			s.counters["orders:outbox_relay_claims_total"] = claims[i]
		}
		if trips != nil {
			s.counters["orders:outbox_relay_db_roundtrips_total"] = trips[i]
		}
		out = append(out, s)
	}
	return out
}

func TestValueAtInterpolatesBetweenSamples(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := samplesOf(t0, []time.Duration{0, time.Second, 3 * time.Second}, []float64{0, 100, 300}, nil, nil)
	for _, c := range []struct {
		at   time.Duration
		want float64
		ok   bool
	}{
		{0, 0, true}, {500 * time.Millisecond, 50, true}, {1500 * time.Millisecond, 200, true}, {2 * time.Second, 300, true},
		{-time.Second, 0, false}, {3 * time.Second, 0, false},
	} {
		got, ok := valueAt(s, t0.Add(c.at), counterOf("orders:outbox_published_total"))
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("valueAt(+%v) = %v, %v; want %v, %v", c.at, got, ok, c.want, c.ok)
		}
	}
	// k6 exits between two samples: its last interval's rate carries on.
	exited := samplesOf(t0, []time.Duration{0, time.Second, 2 * time.Second, 0}, []float64{0, 0, 0, 0}, nil, nil)
	delete(exited[3].cpu, "orders")
	if got, ok := valueAt(exited, t0.Add(2500*time.Millisecond), cpuOf("orders")); !ok || math.Abs(got-2.5) > 1e-9 {
		t.Errorf("after the process exited: %v, %v; want 2.5 s, extrapolated", got, ok)
	}
	if _, ok := valueAt(exited[1:], t0.Add(2500*time.Millisecond), cpuOf("orders")); !ok {
		t.Error("with one sample before the exit there is a rate to carry on")
	}
	if _, ok := valueAt(exited[2:], t0.Add(2500*time.Millisecond), cpuOf("orders")); ok {
		t.Error("extrapolated without an interval to take the rate from")
	}
	started := samplesOf(t0, []time.Duration{0, time.Second, 2 * time.Second}, []float64{0, 0, 0}, nil, nil)
	delete(started[0].cpu, "orders")
	if got, ok := valueAt(started, t0.Add(500*time.Millisecond), cpuOf("orders")); !ok || math.Abs(got-0.5) > 1e-9 {
		t.Errorf("before the process was found: %v, %v; want 0.5 s, extrapolated back", got, ok)
	}
	if _, ok := valueAt(s, t0.Add(time.Second), counterOf("missing")); ok {
		t.Error("a key no sample has got a value")
	}
	d, ok := delta(s, t0.Add(500*time.Millisecond), t0.Add(1500*time.Millisecond), cpuOf("orders"))
	if !ok || math.Abs(d-1.5) > 1e-9 {
		t.Errorf("CPU delta over [0.5 s, 1.5 s] = %v, %v; want 0.5 s + 1 s", d, ok)
	}
}

func TestCPUPerOrderAddsTheProgramsAndEverythingButK6(t *testing.T) {
	t0 := time.Now()
	// Every group uses 1 s of CPU over the 2 s; 1,000 orders: 1,000 µs each.
	s := samplesOf(t0, []time.Duration{0, 500 * time.Millisecond, time.Second}, []float64{0, 0, 0}, nil, nil)
	got := cpuPerOrder(s, t0, t0.Add(2*time.Second), 1000)
	for g, want := range map[string]float64{"orders": 1000, "postgres": 1000, cpuPrograms: 4000, cpuAllButK6: 6000} {
		if math.Abs(got[g]-want) > 1e-6 {
			t.Errorf("%s = %v µs, want %v", g, got[g], want)
		}
	}
	if _, ok := got["k6"]; ok {
		t.Error("k6 has a figure without samples")
	}
	for _, smp := range s { // a broker never found
		delete(smp.cpu, "kafka")
	}
	if _, ok := cpuPerOrder(s, t0, t0.Add(2*time.Second), 1000)[cpuAllButK6]; ok {
		t.Error("everything but k6 was summed without Kafka")
	}
	if cpuPerOrder(s, t0, t0.Add(time.Second), 0) != nil {
		t.Error("a window without orders has CPU per order")
	}
}

func TestRelayCostIsNaWithoutTheRelaysCounters(t *testing.T) {
	t0 := time.Now()
	old := samplesOf(t0, []time.Duration{0, 0}, []float64{0, 100}, nil, nil)
	c, ok := relayCost(old, "orders", t0, t0.Add(time.Second))
	if !ok || c.Events != 100 || !math.IsNaN(c.ClaimsPerEvent) || !math.IsNaN(c.RoundTripsPerEvent) {
		t.Fatalf("a relay without outbox_relay_*: %+v, %v; want 100 events and n/a", c, ok)
	}
	if f := formatValue(c.ClaimsPerEvent, ""); f != "n/a" {
		t.Errorf("NaN reads %q, want n/a", f)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("NaN does not marshal: %v", err)
	}
	var back RelayCost
	if err := json.Unmarshal(b, &back); err != nil || back.Events != 100 || !math.IsNaN(back.ClaimsPerEvent) {
		t.Fatalf("%s reads back as %+v, %v", b, back, err)
	}
	cur := samplesOf(t0, []time.Duration{0, 0}, []float64{0, 100}, []float64{10, 35}, []float64{0, 80})
	c, ok = relayCost(cur, "orders", t0, t0.Add(time.Second))
	if !ok || c.ClaimsPerEvent != 0.25 || c.RoundTripsPerEvent != 0.8 {
		t.Fatalf("relay cost = %+v, %v; want 0.25 claims and 0.8 round trips per event", c, ok)
	}
	if _, ok := relayCost(cur, "billing", t0, t0.Add(time.Second)); ok {
		t.Error("a relay nothing was read of has a cost")
	}
}

func TestJoinOrdersTakesEachHopFromTheDatabasesTimestamps(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	placed := map[string]time.Time{"o1": ms(0), "o2": ms(10), "o3": ms(20)}
	settled := map[string]time.Time{"o1": ms(50), "o2": ms(90)}
	ordersOut := []outboxEvent{{"e1", "o1", ms(1), ms(2)}, {"e2", "o2", ms(11), ms(20)}, {"e3", "o3", ms(21), time.Time{}}}
	// e1 reached billing twice (a redelivery): the inbox keeps the first.
	billingIn := map[string]time.Time{"e1": ms(5), "e2": ms(31)}
	billingOut := []outboxEvent{{"p1", "o1", ms(7), ms(8)}, {"p2", "o2", ms(33), time.Time{}}}
	shimIn := map[string]time.Time{"p1": ms(9)}
	got := joinOrders(placed, settled, ordersOut, billingIn, billingOut, shimIn)
	if len(got) != 3 || !got[0].placed.Equal(ms(0)) || !got[2].placed.Equal(ms(20)) {
		t.Fatalf("orders not sorted by placement: %+v", got)
	}
	want := []struct{ hop1, hop2 time.Duration }{{4 * time.Millisecond, 2 * time.Millisecond}, {20 * time.Millisecond, -1}, {-1, -1}}
	for i, w := range want {
		if got[i].hop1 != w.hop1 || got[i].hop2 != w.hop2 {
			t.Errorf("order %d: hops %v, %v; want %v, %v", i, got[i].hop1, got[i].hop2, w.hop1, w.hop2)
		}
	}
	if !got[2].settled.IsZero() {
		t.Error("an unsettled order has a settlement")
	}
	// o1: out 1, claimed 2, billing 5, its event 7, claimed 8, shim 9, settled 50.
	d := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	wantStages := [][len(stageNames)]time.Duration{
		{d(1), d(3), d(2), d(1), d(1), d(41)},
		{d(9), d(11), -1, -1, -1, -1}, // p2 never reached the shim: hop 2 unknown
		{-1, -1, -1, -1, -1, -1},      // e3 never claimed
	}
	for i, w := range wantStages {
		if got[i].stages != w {
			t.Errorf("order %d: stages %v; want %v", i, got[i].stages, w)
		}
	}
	w := window(100, ms(0), ms(30), got, nil)
	if len(w.Stages) != len(stageNames) || w.Stages[5].Events != 1 || w.Stages[0].Events != 2 {
		t.Errorf("window stages = %+v; want all six, the first of two orders, the last of one", w.Stages)
	}
	if tbl := stagesTable([]Window{w}); !strings.Contains(tbl, "| 100/s | 1.0 ms") {
		t.Errorf("stages table:\n%s", tbl)
	}
}

func TestWindowTellsAGrowingLagFromASteadyOne(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// 100 orders over 10 s; lag lagOf(i) ms; hops 2 and 3 ms.
	orders := func(lagOf func(i int) int) []placedOrder {
		var out []placedOrder
		for i := range 100 {
			at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
			o := placedOrder{placed: at, hop1: 2 * time.Millisecond, hop2: 3 * time.Millisecond}
			if l := lagOf(i); l >= 0 {
				o.settled = at.Add(time.Duration(l) * time.Millisecond)
			}
			out = append(out, o)
		}
		return out
	}
	end := t0.Add(10 * time.Second)
	steady := window(10, t0, end, orders(func(int) int { return 40 }), nil)
	if steady.LagGrowing || steady.PlacedPerSecond != 10 || steady.LagFirstMs != 40 || steady.LagLastMs != 40 {
		t.Errorf("steady lag: %+v", steady)
	}
	if steady.Hop1.Events != 100 || steady.Hop1.P99Ms != 2 || steady.Hop2.P50Ms != 3 {
		t.Errorf("hops: %+v %+v", steady.Hop1, steady.Hop2)
	}
	growing := window(10, t0, end, orders(func(i int) int { return 40 + 20*i }), nil)
	if !growing.LagGrowing || growth(growing) <= 100 {
		t.Errorf("lag growing by 20 ms per order: %+v", growing)
	}
	tail := window(10, t0, end, orders(func(i int) int {
		if i > 90 {
			return -1
		}
		return 40
	}), nil)
	if !tail.LagGrowing || tail.Unsettled != 9 || !math.IsInf(growth(tail), 1) {
		t.Errorf("last orders never settled: %+v", tail)
	}
	starved := window(10, t0, end, orders(func(int) int { return 40 })[:70], nil)
	if !starved.LagGrowing || !math.IsInf(growth(starved), 1) {
		t.Errorf("no order placed in the last quarter: %+v", starved)
	}
	if f := formatValue(growth(tail), "ms"); !strings.HasPrefix(f, "∞") {
		t.Errorf("growth reads %q", f)
	}
}

func TestRampWindowsAreThePlateaus(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := rampWindows([]float64{100, 200}, 10*time.Second, t0)
	if len(w) != 2 || !w[0][0].Equal(t0.Add(3*time.Second)) || !w[0][1].Equal(t0.Add(13*time.Second)) ||
		!w[1][0].Equal(t0.Add(16*time.Second)) || !w[1][1].Equal(t0.Add(26*time.Second)) {
		t.Fatalf("plateaus %v; want [3 s, 13 s] and [16 s, 26 s] after the start (3 s climbs, ramp.js)", w)
	}
}

func TestE2ETableWithABase(t *testing.T) {
	ramp := func(side string, knee, placed2000, hop100, cpu float64) Run {
		return Run{Key: "ramp", Side: side, Windows: []Window{
			{Rate: 100, Hop1: HopStat{Events: 10, P50Ms: hop100 / 2, P99Ms: hop100}, Hop2: HopStat{Events: 10, P50Ms: 1, P99Ms: 2}},
			{Rate: 1000, CPUPerOrderUs: map[string]float64{cpuPrograms: cpu, cpuAllButK6: 2 * cpu}},
			{Rate: 2000, PlacedPerSecond: placed2000, SettledPerSecond: placed2000, LagFirstMs: 50, LagLastMs: 4000, LagGrowing: true},
		}, K6: rigReport(knee)}
	}
	res := Results{Base: "bd56e64aaaaaaaaaaaaa", Runs: []Run{
		ramp("", 1000, 1600, 8, 500), ramp("base", 100, 450, 60, 2000),
		ramp("", 1200, 1800, 6, 700), // a second round: figures are means
	}}
	table := e2eTable(res)
	for _, want := range []string{
		"| figure | measured | base bd56e64aaaaa | ratio (measured ÷ base) |",
		"| knee: highest step with lag p99 ≤ 100 ms and ≥ 95 % placed | 1,100 orders/s | 100 orders/s | 11.00× |",
		"| 2,000 orders/s offered: placed / settled | 1,700 orders/s / 1,700 orders/s | 450 orders/s / 450 orders/s | 3.78× / 3.78× |",
		"| 2,000 orders/s offered: lag growth over the step (median, last quarter − first) | 3,950 ms | 3,950 ms | — |",
		"| one hop at 100 orders/s, orders → billing: p50 / p99 | 3.5 ms / 7.0 ms | 30.0 ms / 60.0 ms | 0.12× / 0.12× |",
		"| CPU per order at 1,000 orders/s: the four programs / everything but k6 / k6 | 600 µs / 1,200 µs / n/a | 2,000 µs / 4,000 µs / n/a | 0.30× / 0.30× / n/a |",
	} {
		requireRow(t, "the table", table, want)
	}
	windows := windowsTable(res.Runs)
	for _, want := range []string{"| ramp (base) | 100 | 0 | 0 | 0 → 0 ms | 30.0 ms / 60.0 ms | 1.0 ms / 2.0 ms | n/a / n/a / n/a | n/a, n/a |",
		"| ramp | 2,000 | 1,600 | 1,600 | 50 → 4,000 ms (growing) | n/a | n/a |"} {
		requireRow(t, "the windows table", windows, want)
	}
	ab := abTable(res)
	requireRow(t, "the A/B table", ab, "| figure: this tree / base bd56e64aaaaa (ratio) | ramp |")
	requireRow(t, "the A/B table", ab, "| knee | 1,100 orders/s / 100 orders/s (11.00×) |")
	if abTable(Results{Runs: res.Runs}) != "" {
		t.Error("an A/B table without -base")
	}
	if strings.Contains(e2eTable(Results{Runs: res.Runs[:1]}), "ratio") {
		t.Error("a table without -base has a ratio column")
	}
	if strings.Contains(table, "goal") || strings.Contains(table, "met") {
		t.Errorf("the end-to-end table judges a goal:\n%s", table)
	}
}

func TestParseFlagsAB(t *testing.T) {
	o, err := parseFlags([]string{"bench", "-base", "bd56e64", "-ab-rounds", "2", "-profile-dir", "benchmarks/profiles"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.base != "bd56e64" || o.abRounds != 2 || o.profileDir != "benchmarks/profiles" {
		t.Errorf("parsed %+v", o)
	}
	if o, _ := parseFlags([]string{"bench"}, io.Discard); o.base != "" || o.abRounds != 1 || o.profileDir != "" {
		t.Errorf("defaults: base %q, rounds %d, profile dir %q; want none, 1, none", o.base, o.abRounds, o.profileDir)
	}
	if _, err := parseFlags([]string{"bench", "-ab-rounds", "0"}, nil); err == nil {
		t.Error("-ab-rounds 0 was accepted")
	}
	if _, err := parseSteps("100,x"); err == nil {
		t.Error("-steps 100,x was accepted")
	}
}

func rigReport(knee float64) rig.Report { return rig.Report{Knee: knee} }

func TestHistogramHopFromTheInboxsOwnBuckets(t *testing.T) {
	text := `# TYPE inbox_hop_seconds histogram
inbox_hop_seconds_bucket{consumer="billing",le="0.005"} 10
inbox_hop_seconds_bucket{consumer="billing",le="0.01"} 90
inbox_hop_seconds_bucket{consumer="billing",le="0.02"} 100
inbox_hop_seconds_bucket{consumer="billing",le="+Inf"} 100
inbox_hop_seconds_sum{consumer="billing"} 0.9
inbox_hop_seconds_count{consumer="billing"} 100
`
	b := parseBuckets(strings.NewReader(text), hopHistogram)
	if len(b) != 4 || b["0.01"] != 90 || b["+Inf"] != 100 {
		t.Fatalf("parseBuckets = %v", b)
	}
	t0 := time.Now()
	s := []sample{{at: t0, counters: map[string]float64{}}, {at: t0.Add(time.Second), counters: map[string]float64{}}}
	for le, v := range b {
		s[1].counters["billing:"+hopHistogram+"_bucket|le="+le] = v
		s[0].counters["billing:"+hopHistogram+"_bucket|le="+le] = 0
	}
	h, ok := histogramHop(s, "billing", t0, t0.Add(time.Second))
	// p50: rank 50 in (5 ms, 10 ms] holding 10..90: 5 + 5 × 40/80 = 7.5 ms;
	// p99: rank 99 in (10 ms, 20 ms] holding 90..100: 10 + 10 × 9/10 = 19 ms.
	if !ok || h.Events != 100 || math.Abs(h.P50Ms-7.5) > 1e-9 || math.Abs(h.P99Ms-19) > 1e-9 {
		t.Fatalf("histogramHop = %+v, %v; want 100 events, p50 7.5 ms, p99 19 ms", h, ok)
	}
	if _, ok := histogramHop(s, "shim", t0, t0.Add(time.Second)); ok {
		t.Error("a program without the histogram has a hop")
	}
}

// requireRow fails the test (and goes on) unless table, a generated
// Markdown table named what, holds the row want.
func requireRow(t *testing.T, what, table, want string) {
	t.Helper()
	if !strings.Contains(table, want) {
		t.Errorf("%s lacks\n%s\nin\n%s", what, want, table)
	}
}

func TestStatementsTableNamesEachProgramAndTheFrequentStatements(t *testing.T) {
	runs := []Run{
		{Key: "outbox", StatementsPerOrder: map[string]float64{"orders": 1.25, "billing": 2, "shim": 3, "all": 6.25},
			TopStatements: []stmtStat{{Program: "orders", PerOrder: 1, ExecUsPerOrder: 12, Query: "INSERT INTO orders (a|b) VALUES ($1)"}}},
		{Key: "outbox", Side: "base", StatementsPerOrder: map[string]float64{"orders": 5, "all": 5}},
		{Key: "ramp"},
		{Key: "spike", StatementsPerOrder: map[string]float64{"orders": 7, "all": 7}},
	}
	got := statementsTable(runs)
	for _, want := range []string{
		"| outbox | 1.2 | 2.0 | 3.0 | 6.2 |",
		"| outbox (base) | 5.0 | 0.0 | 0.0 | 5.0 |",
		"| orders | 1.00 | 12 | `INSERT INTO orders (a\\|b) VALUES ($1)` |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("statements table lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "| ramp |") || strings.Contains(got, "| spike |") {
		t.Errorf("a run without counts, or one the page leaves to the JSON, has a row:\n%s", got)
	}
	if statementsTable([]Run{{Key: "ramp"}}) != "" {
		t.Error("no counts, yet a table")
	}
}

// The Postgres backends serving k6 (its settlement poll, its audit) are
// k6's work, not the platform's: their CPU moves from "postgres" to "k6",
// and stays moved after they end.
func TestK6sQueriesAreChargedToK6(t *testing.T) {
	pgURL := testinfra.NewDatabase(t)
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = rig.K6ApplicationName
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Work that shows in /proc: a few hundred ms of a backend's CPU.
	if _, err := conn.Exec(ctx, `SELECT count(*) FROM generate_series(1, 5000000)`); err != nil {
		t.Fatal(err)
	}
	p := &rig.Platform{OrdersDB: pgURL, BillingDB: pgURL, ShimDB: pgURL}
	for _, kv := range p.K6Env() {
		if strings.HasSuffix(strings.SplitN(kv, "=", 2)[0], "_DB") && !strings.Contains(kv, "application_name="+rig.K6ApplicationName) {
			t.Errorf("k6's %s does not name k6 as its application", kv)
		}
	}
	s := &sampler{pgURL: pgURL}
	cpu := map[string]time.Duration{"postgres": time.Hour, "k6": time.Minute}
	s.chargeK6Queries(cpu)
	moved := time.Hour - cpu["postgres"]
	if moved < 50*time.Millisecond || cpu["k6"] != time.Minute+moved {
		t.Fatalf("after the charge: postgres %v, k6 %v; want some of k6's backend's CPU (≥ 50 ms) moved from one to the other", cpu["postgres"], cpu["k6"])
	}
	conn.Close(ctx)
	testinfra.WaitFor(t, 10*time.Second, "k6's backend to end", func() (bool, error) {
		pids, err := rig.K6BackendPIDs(ctx, pgURL)
		return len(pids) == 0, err
	})
	again := map[string]time.Duration{"postgres": time.Hour, "k6": time.Minute}
	s.chargeK6Queries(again)
	if time.Hour-again["postgres"] < moved {
		t.Errorf("once k6's backend ended, %v moved, want at least the %v it was seen with", time.Hour-again["postgres"], moved)
	}
}
