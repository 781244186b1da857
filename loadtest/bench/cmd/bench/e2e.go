package main

import (
	"bytes"
	"fmt"
	"math"
	"strings"
)

// The platform's end-to-end figures (the ramp's windows, the runs as a
// whole), with -base the base revision's value from the same run and the
// ratio. Every figure is the mean over the -ab-rounds runs of its side.

// figure is one row's value: v, or NaN when its run or window is missing.
type figure struct {
	v    float64
	text string // how v reads, e.g. "1,000 orders/s"
}

var na = figure{v: math.NaN(), text: "n/a"}

// sideRuns returns the runs of scenario key on one side, in order.
func sideRuns(res Results, key, sideName string) []Run {
	var out []Run
	for _, r := range res.Runs {
		if r.Key == key && r.Side == sideName {
			out = append(out, r)
		}
	}
	return out
}

// mean averages get over runs, skipping runs where it has no value.
func mean(runs []Run, get func(Run) (float64, bool)) (float64, bool) {
	sum, n := 0.0, 0
	for _, r := range runs {
		if v, ok := get(r); ok && !math.IsNaN(v) {
			sum += v
			n++
		}
	}
	if n == 0 {
		return math.NaN(), false
	}
	return sum / float64(n), true
}

// windowAt returns run's window at offered rate, if the run had one.
func windowAt(r Run, rate float64) (Window, bool) {
	for _, w := range r.Windows {
		if w.Rate == rate {
			return w, true
		}
	}
	return Window{}, false
}

// figureRow is one row of the end-to-end table: how to read it from one
// side's runs. Goals are not here: the project has one set, goals.go's,
// judged once, in the headline.
type figureRow struct {
	label string
	key   string // the scenario the figure comes from
	get   func(Run) (float64, bool)
	unit  string // "orders/s", "ms", "µs", "" (a plain number)
	// difference: the figure is a change (can be negative or zero), so
	// dividing it by the base's says nothing; no ratio is printed.
	difference bool
}

func inWindow(rate float64, f func(Window) (float64, bool)) func(Run) (float64, bool) {
	return func(r Run) (float64, bool) {
		w, ok := windowAt(r, rate)
		if !ok {
			return 0, false
		}
		return f(w)
	}
}

func cpuIn(group string) func(Window) (float64, bool) {
	return func(w Window) (float64, bool) {
		v, ok := w.CPUPerOrderUs[group]
		return v, ok
	}
}

// hopIn is hop n's (1: orders → billing, 2: billing → shim) quantile q
// ("p50", "p99") in a window, where the window has hops.
func hopIn(n int, q string) func(Window) (float64, bool) {
	return func(w Window) (float64, bool) {
		h := w.Hop1
		if n == 2 {
			h = w.Hop2
		}
		if h.Events == 0 {
			return 0, false
		}
		if q == "p50" {
			return h.P50Ms, true
		}
		return h.P99Ms, true
	}
}

// figureRows are the rows of the end-to-end table. The rates are the
// ramp's steps: make bench's default -steps include 100, 1,000 and 2,000.
// A row without a label continues the one before it ("p50 / p99"). The
// relays' claims and round trips per event are in the windows table.
func figureRows() []figureRow {
	return []figureRow{
		{label: "knee: highest step with lag p99 ≤ 100 ms and ≥ 95 % placed", key: "ramp",
			get: func(r Run) (float64, bool) { return r.K6.Knee, true }, unit: "orders/s"},
		{label: "2,000 orders/s offered: placed / settled", key: "ramp",
			get:  inWindow(2000, func(w Window) (float64, bool) { return w.PlacedPerSecond, true }),
			unit: "orders/s"},
		{key: "ramp", get: inWindow(2000, func(w Window) (float64, bool) { return w.SettledPerSecond, true }), unit: "orders/s"},
		{label: "2,000 orders/s offered: lag growth over the step (median, last quarter − first)", key: "ramp",
			get:  inWindow(2000, func(w Window) (float64, bool) { return growth(w), true }),
			unit: "ms", difference: true},
		{label: "one hop at 100 orders/s, orders → billing: p50 / p99", key: "ramp", get: inWindow(100, hopIn(1, "p50")), unit: "ms"},
		{key: "ramp", get: inWindow(100, hopIn(1, "p99")), unit: "ms"},
		{label: "one hop at 100 orders/s, billing → shim: p50 / p99", key: "ramp", get: inWindow(100, hopIn(2, "p50")), unit: "ms"},
		{key: "ramp", get: inWindow(100, hopIn(2, "p99")), unit: "ms"},
		{label: "one hop at 1,000 orders/s, orders → billing: p50 / p99", key: "ramp", get: inWindow(1000, hopIn(1, "p50")), unit: "ms"},
		{key: "ramp", get: inWindow(1000, hopIn(1, "p99")), unit: "ms"},
		{label: "one hop at 1,000 orders/s, billing → shim: p50 / p99", key: "ramp", get: inWindow(1000, hopIn(2, "p50")), unit: "ms"},
		{key: "ramp", get: inWindow(1000, hopIn(2, "p99")), unit: "ms"},
		{label: "CPU per order at 1,000 orders/s: the four programs / everything but k6 / k6", key: "ramp",
			get: inWindow(1000, cpuIn(cpuPrograms)), unit: "µs"},
		{key: "ramp", get: inWindow(1000, cpuIn(cpuAllButK6)), unit: "µs"},
		{key: "ramp", get: inWindow(1000, cpuIn("k6")), unit: "µs"},
	}
}

// growth is how much a window's lag grew over it, in ms; +Inf when orders
// of its last quarter never settled or none were placed then.
func growth(w Window) float64 {
	if w.LagGrowing && w.LagLastMs-w.LagFirstMs <= float64(lagBudget.Milliseconds()) {
		return math.Inf(1)
	}
	return w.LagLastMs - w.LagFirstMs
}

func formatValue(v float64, unit string) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case math.IsInf(v, 1):
		return "∞ (orders unsettled, or none placed)"
	case unit == "":
		return f2(v)
	case unit == "ms" && math.Abs(v) < 100:
		return f1(v) + " ms"
	}
	return f0(v) + " " + unit
}

// e2eTable is the platform's end-to-end figures from the ramp's steps,
// with -base the base's and the ratio.
func e2eTable(res Results) string {
	withBase := res.Base != ""
	var b bytes.Buffer
	header := []string{"figure", "measured"}
	if withBase {
		header = append(header, "base "+short(res.Base), "ratio (measured ÷ base)")
	}
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
	rows := figureRows()
	for i := 0; i < len(rows); i++ {
		row := rows[i]
		group := []figureRow{row}
		for i+1 < len(rows) && rows[i+1].label == "" {
			i++
			group = append(group, rows[i])
		}
		var got, base, ratios []string
		for _, g := range group {
			v, ok := mean(sideRuns(res, g.key, ""), g.get)
			got = append(got, formatValue(v, g.unit))
			if withBase {
				bv, bok := mean(sideRuns(res, g.key, "base"), g.get)
				base = append(base, formatValue(bv, g.unit))
				switch {
				case g.difference:
					ratios = append(ratios, "—")
				case ok && bok && bv != 0 && !math.IsInf(v, 0) && !math.IsInf(bv, 0):
					ratios = append(ratios, f2(v/bv)+"×")
				default:
					ratios = append(ratios, "n/a")
				}
			}
		}
		cells := []string{row.label, strings.Join(got, " / ")}
		if withBase {
			cells = append(cells, strings.Join(base, " / "), strings.Join(ratios, " / "))
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
	}
	return b.String()
}

// short is a revision as the tables name it.
func short(rev string) string { return rev[:min(len(rev), 12)] }

// label names a run in the tables: its scenario, side and round.
func (r Run) label() string {
	label := r.Key
	if r.Side != "" {
		label += " (" + r.Side + ")"
	}
	if r.Round > 0 {
		label += fmt.Sprintf(" #%d", r.Round+1)
	}
	return label
}

// windowsTable lists the windows of runs (a ramp's steps, a steady run's
// load) with the figures measured from the databases and /proc; first
// names each row's run when there are several.
func windowsTable(runs []Run) string {
	var b bytes.Buffer
	b.WriteString("| run | offered | placed | settled | lag median first → last quarter | hop orders → billing p50 / p99 | hop billing → shim p50 / p99 | CPU µs/order: programs / all but k6 / k6 | relay claims / round trips per event: orders, billing |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		label := r.label()
		for _, w := range r.Windows {
			relay := func(svc string) string {
				c, ok := w.Relay[svc]
				if !ok {
					return "n/a"
				}
				return formatValue(c.ClaimsPerEvent, "") + " / " + formatValue(c.RoundTripsPerEvent, "")
			}
			cpu := func(g string) string {
				if v, ok := w.CPUPerOrderUs[g]; ok {
					return f0(v)
				}
				return "n/a"
			}
			growing := ""
			if w.LagGrowing {
				growing = " (growing)"
			}
			hop := func(h HopStat, consumer string) string {
				out := "n/a"
				if h.Events > 0 {
					out = formatValue(h.P50Ms, "ms") + " / " + formatValue(h.P99Ms, "ms")
				}
				if m, ok := w.HopMetric[consumer]; ok {
					out += " (" + hopHistogram + ": " + formatValue(m.P50Ms, "ms") + " / " + formatValue(m.P99Ms, "ms") + ")"
				}
				return out
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s → %s ms%s | %s | %s | %s / %s / %s | %s, %s |\n",
				label, f0(w.Rate), f0(w.PlacedPerSecond), f0(w.SettledPerSecond), f0(w.LagFirstMs), f0(w.LagLastMs), growing,
				hop(w.Hop1, "billing"), hop(w.Hop2, "shim"), cpu(cpuPrograms), cpu(cpuAllButK6), cpu("k6"), relay("orders"), relay("billing"))
		}
	}
	return b.String()
}

// abTable compares, scenario by scenario, what both sides' k6 runs
// measured as a whole: every scenario that ran against the base, whichever
// -only chose, has its column (means over the rounds).
func abTable(res Results) string {
	if res.Base == "" {
		return ""
	}
	type metric struct {
		label string
		unit  string
		get   func(Run) (float64, bool)
	}
	k6 := func(f func(Run) float64) func(Run) (float64, bool) {
		return func(r Run) (float64, bool) { return f(r), true }
	}
	whole := func(f func(Window) (float64, bool)) func(Run) (float64, bool) {
		return func(r Run) (float64, bool) {
			if len(r.Windows) != 1 { // steady and soak runs: their whole load
				return 0, false
			}
			return f(r.Windows[0])
		}
	}
	cpu := func(g string) func(Run) (float64, bool) {
		return func(r Run) (float64, bool) {
			v, ok := r.CPUPerOrderUs[g]
			return v, ok
		}
	}
	metrics := []metric{
		{"orders placed per second", "orders/s", k6(func(r Run) float64 { return r.K6.OrdersPerSecond })},
		{"commit → settlement lag p50", "ms", k6(func(r Run) float64 { return r.K6.LagP50Ms })},
		{"commit → settlement lag p99", "ms", k6(func(r Run) float64 { return r.K6.LagP99Ms })},
		{"POST /orders p99", "ms", k6(func(r Run) float64 { return r.K6.HTTPP99Ms })},
		{"knee", "orders/s", func(r Run) (float64, bool) { return r.K6.Knee, r.Key == "ramp" }},
		{"hop orders → billing p99", "ms", whole(func(w Window) (float64, bool) { return w.Hop1.P99Ms, w.Hop1.Events > 0 })},
		{"hop billing → shim p99", "ms", whole(func(w Window) (float64, bool) { return w.Hop2.P99Ms, w.Hop2.Events > 0 })},
		{"CPU per order, the four programs", "µs", cpu(cpuPrograms)},
		{"CPU per order, everything but k6", "µs", cpu(cpuAllButK6)},
		{"CPU per order, Postgres", "µs", cpu("postgres")},
		{"CPU per order, Kafka", "µs", cpu("kafka")},
	}
	// One row per figure, one column per scenario that ran on both sides:
	// "this tree / base (ratio)".
	var keys []string
	for _, key := range []string{"outbox", "ramp", "spike", "soak"} {
		if len(sideRuns(res, key, "")) > 0 && len(sideRuns(res, key, "base")) > 0 {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return ""
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "| figure: this tree / base %s (ratio) | %s |\n|---|%s\n", short(res.Base), strings.Join(keys, " | "), strings.Repeat("---|", len(keys)))
	for _, m := range metrics {
		cells := []string{m.label}
		any := false
		for _, key := range keys {
			v, ok := mean(sideRuns(res, key, ""), m.get)
			bv, bok := mean(sideRuns(res, key, "base"), m.get)
			if !ok && !bok {
				cells = append(cells, "")
				continue
			}
			any = true
			r := "n/a"
			if ok && bok && bv != 0 {
				r = f2(v/bv) + "×"
			}
			cells = append(cells, fmt.Sprintf("%s / %s (%s)", formatValue(v, m.unit), formatValue(bv, m.unit), r))
		}
		if any {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
		}
	}
	return b.String()
}
