package main

import (
	"bytes"
	"fmt"
	"math"
	"strings"
)

// The headline is BENCHMARKS.md's first screen, read in 30 seconds: when
// and where the latest make bench ran, whether the machine was quiet, the
// base it was compared with, and one table of every goal's figure with its
// same-run baseline, the ratio, the goal and the verdict. It is written by
// every run that runs the main parts, whole, so it never mixes runs: a part
// this invocation did not run says so in its rows instead of showing an
// older run's numbers.

const (
	headlineBeginMarker = "<!-- make bench: headline begin -->"
	headlineEndMarker   = "<!-- make bench: headline end -->"
	headlineTitle       = "## The latest `make bench` (generated)"
)

// headlineRow is one row of the headline table.
type headlineRow struct {
	figure, measured, baseline, ratio, goal, verdict string
}

// headlineInput is what the headline reads besides the run's results.
type headlineInput struct {
	res Results
	// ran are the parts this invocation ran (Results.Parts, or inferred
	// from the results of a run older than that field).
	ran map[string]bool
	// latestPeers says when the latest peers run was, for the rows of a
	// run without it ("" when unknown).
	latestPeers string
}

// ranParts are the parts res says ran: its Parts, or, for results written
// before Parts existed, the parts whose results it holds.
func ranParts(res Results) map[string]bool {
	ran := map[string]bool{}
	for _, p := range res.Parts {
		ran[p] = true
	}
	if len(res.Parts) > 0 {
		return ran
	}
	for part := range res.Go {
		if strings.HasPrefix(part, "cdc-") {
			ran["cdc"] = true
		} else {
			ran[part] = true
		}
	}
	for _, r := range res.Runs {
		switch r.Key {
		case "outbox", "naive":
			ran["modes"] = true
		default:
			ran[r.Key] = true
		}
	}
	ran["peers"] = len(res.Peers) > 0
	ran["knobs"] = len(res.Knobs) > 0
	return ran
}

func verdictOf(g goal, v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return verdict(g.met(v))
}

// headlineRows are the headline table's rows, in goals.go's order.
func headlineRows(in headlineInput) []headlineRow {
	res := in.res
	var rows []headlineRow
	add := func(r headlineRow) { rows = append(rows, r) }
	// absent is a row whose part did not run, or ran and gave nothing.
	absent := func(figure, part, g string) headlineRow {
		if in.ran[part] {
			return headlineRow{figure, "no result: the part failed (see Problems)", "", "", g, "n/a"}
		}
		return headlineRow{figure, fmt.Sprintf("not run in this invocation (`-only` without %s)", part), "", "", g, ""}
	}
	withBase := res.Base != ""
	baseName := "BASE " + short(res.Base)
	// baseCells are a figure's baseline and ratio cells against the base.
	baseCells := func(v, bv float64, bok bool, unit string) (string, string) {
		if !withBase {
			return "no `-base`", ""
		}
		if !bok || math.IsNaN(bv) {
			return "n/a (" + baseName + ")", "n/a"
		}
		r := "n/a"
		if bv != 0 && !math.IsNaN(v) {
			r = f2(v/bv) + "×"
		}
		return formatValue(bv, unit) + " (" + baseName + ")", r
	}

	// The ramp: knee, the CPU bound, 2,000 offered, CPU per order.
	work, base := sideRuns(res, "ramp", ""), sideRuns(res, "ramp", "base")
	knee := func(r Run) (float64, bool) { return r.K6.Knee, true }
	const kneeFigure = "knee: highest ramp step with commit → settlement p99 ≤ 100 ms and ≥ 95 % placed"
	const boundFigure = "knee ÷ the CPU bound of this run (its CPUs ÷ CPU per order at 1,000/s, k6 included)"
	const settledFigure = "2,000 orders/s offered: settled"
	const progFigure = "CPU per order at 1,000 orders/s: the four programs"
	const allFigure = "CPU per order at 1,000 orders/s: everything but k6"
	if len(work) == 0 {
		for _, r := range []struct{ figure, goal string }{{kneeFigure, goalKnee.text}, {boundFigure, goalKneeOfBound.text},
			{settledFigure, goalSettledAt2000.text}, {progFigure, goalCPUPrograms.text}, {allFigure, goalCPUAllButK6.text}} {
			add(absent(r.figure, "ramp", r.goal))
		}
	} else {
		v, _ := mean(work, knee)
		bv, bok := mean(base, knee)
		bl, r := baseCells(v, bv, bok, "orders/s")
		add(headlineRow{kneeFigure, formatValue(v, "orders/s"), bl, r, goalKnee.text, verdictOf(goalKnee, v)})

		// The rounds' mean CPU per order, then the bound: a bound per round
		// averaged would weigh a cheap round more than a dear one.
		all, ok1 := mean(work, inWindow(cpuBoundRate, cpuIn(cpuAllButK6)))
		k6, ok2 := mean(work, inWindow(cpuBoundRate, cpuIn("k6")))
		bound := cpuBound(Window{CPUPerOrderUs: map[string]float64{cpuAllButK6: all, "k6": k6}}, res.Machine.CPUs)
		if ok1 && ok2 && bound > 0 {
			add(headlineRow{boundFigure, formatValue(v, "orders/s"), formatValue(bound, "orders/s") + " (CPU bound)",
				f2(v / bound), goalKneeOfBound.text, verdictOf(goalKneeOfBound, v/bound)})
		} else {
			add(headlineRow{boundFigure, formatValue(v, "orders/s"), "n/a: no CPU figures at the 1,000 orders/s step", "n/a", goalKneeOfBound.text, "n/a"})
		}

		for _, f := range []struct {
			figure string
			get    func(Run) (float64, bool)
			unit   string
			g      goal
		}{
			{settledFigure, inWindow(2000, func(w Window) (float64, bool) { return w.SettledPerSecond, true }), "orders/s", goalSettledAt2000},
			{progFigure, inWindow(cpuBoundRate, cpuIn(cpuPrograms)), "µs", goalCPUPrograms},
			{allFigure, inWindow(cpuBoundRate, cpuIn(cpuAllButK6)), "µs", goalCPUAllButK6},
		} {
			v, ok := mean(work, f.get)
			if !ok {
				add(headlineRow{f.figure, "n/a: the ramp had no such step (`-steps`)", "", "", f.g.text, "n/a"})
				continue
			}
			bv, bok := mean(base, f.get)
			bl, r := baseCells(v, bv, bok, f.unit)
			add(headlineRow{f.figure, formatValue(v, f.unit), bl, r, f.g.text, verdictOf(f.g, v)})
		}
	}

	// The library benchmarks: each against its own same-run baseline.
	bench := func(figure, part, key, what, unit, baseWhat string, g *goal) {
		b, ok := res.Go[key]
		if !ok {
			add(absent(figure, part, goalText(g)))
			return
		}
		m := b.Metrics
		judged := "" // reported, no goal
		if g != nil {
			judged = verdictOf(*g, m["ratio"])
		}
		add(headlineRow{figure, f0(m[what]) + " " + unit, f0(m[baseWhat]) + " " + unit + baseLabel(baseWhat), f2(m["ratio"]), goalText(g), judged})
	}
	bench("write path: order + outbox row vs a bare order insert", "write", "write", "outbox-tx/s", "tx/s", "bare-tx/s", nil)
	pollKey, pollPart := "drain", "drain"
	if _, ok := res.Go["drain"]; !ok {
		if _, ok := res.Go["cdc-drain-poll"]; ok {
			pollKey, pollPart = "cdc-drain-poll", "cdc"
		}
	}
	bench("polling relay: drain of a backlog vs raw kafka-go produce of it", pollPart, pollKey, "relay-events/s", "events/s", "raw-events/s", &goalPollDrain)
	bench("log-based relay, table mode (`RELAY_MODE=cdc`): the same", "cdc", "cdc-drain-table", "relay-events/s", "events/s", "raw-events/s", &goalTableDrain)
	bench("log-based relay, WAL-only (`RELAY_MODE=wal`): the same", "cdc", "cdc-drain-wal", "relay-events/s", "events/s", "raw-events/s", nil)

	rows = append(rows, peersHeadlineRows(in)...)

	// Lost and duplicated settlements over every k6 run, each side apart.
	if len(res.Runs) == 0 {
		r := absent("settlements lost / duplicated, every k6 run", "modes, ramp, spike or soak", goalNoneLost.text)
		if in.ran["modes"] || in.ran["ramp"] || in.ran["spike"] || in.ran["soak"] {
			r.measured, r.verdict = "no result: the k6 parts failed (see Problems)", "n/a"
		}
		add(r)
	} else {
		count := func(sideName string) (lost, dup float64, n int) {
			for _, r := range res.Runs {
				if r.Side == sideName {
					lost += r.K6.Lost
					dup += r.K6.Duplicated + r.K6.ThirdPartyDuplicates
					n++
				}
			}
			return lost, dup, n
		}
		lost, dup, _ := count("")
		bl := "no `-base`"
		if withBase {
			bLost, bDup, n := count("base")
			bl = "n/a (" + baseName + ")"
			if n > 0 {
				bl = f0(bLost) + " / " + f0(bDup) + " (" + baseName + ")"
			}
		}
		add(headlineRow{"settlements lost / duplicated, every k6 run", f0(lost) + " / " + f0(dup), bl, "", goalNoneLost.text, verdictOf(goalNoneLost, lost+dup)})
	}
	return rows
}

func goalText(g *goal) string {
	if g == nil {
		return "reported"
	}
	return g.text
}

// baseLabel names a library benchmark's baseline.
func baseLabel(metric string) string {
	switch metric {
	case "bare-tx/s":
		return " (bare insert)"
	case "raw-events/s":
		return " (raw produce)"
	}
	return ""
}

// peersHeadlineRows are goalPeersCPU's rows: at each of peersGoalRates,
// the log-based relay's CPU per event in table and WAL-only mode over
// Debezium's, from this invocation's peers part.
func peersHeadlineRows(in headlineInput) []headlineRow {
	const figure = "log-based relay CPU per event ÷ Debezium's, paced "
	rates := make([]string, len(peersGoalRates))
	for i, r := range peersGoalRates {
		rates[i] = f0(float64(r))
	}
	if len(in.res.Peers) == 0 {
		m := "not run in this invocation (`-only peers`)"
		if in.latestPeers != "" {
			m = "not run in this invocation; the latest peers run: " + in.latestPeers + " ([its section](#" + peersAnchor + "))"
		}
		v := ""
		if in.ran["peers"] {
			m, v = "no result: the part failed (see Problems)", "n/a"
		}
		return []headlineRow{{figure + strings.Join(rates, " / ") + " events/s", m, "", "", goalPeersCPU.text, v}}
	}
	by := map[string][]PeerRun{}
	for _, r := range in.res.Peers {
		by[r.Relay] = append(by[r.Relay], r)
	}
	// meanOf averages get over a relay's rounds; false when no round has it.
	meanOf := func(relay string, get func(PeerRun) (float64, bool)) (float64, bool) {
		sum, n := 0.0, 0
		for _, r := range by[relay] {
			if v, ok := get(r); ok {
				sum += v
				n++
			}
		}
		return sum / float64(max(n, 1)), n > 0
	}
	row := func(label string, get func(PeerRun) (float64, bool)) headlineRow {
		deb, ok := meanOf("debezium", get)
		if !ok || deb == 0 {
			return headlineRow{label, "n/a: no Debezium figure in this run", "", "", goalPeersCPU.text, "n/a"}
		}
		var measured, ratios []string
		met := true
		for _, relay := range []string{"cdc", "wal"} {
			v, ok := meanOf(relay, get)
			if !ok {
				measured, ratios, met = append(measured, relay+" n/a"), append(ratios, "n/a"), false
				continue
			}
			measured = append(measured, fmt.Sprintf("%s %.0f µs", relay, v))
			ratios = append(ratios, f2(v/deb)+"×")
			met = met && goalPeersCPU.met(v/deb)
		}
		return headlineRow{label, strings.Join(measured, " / "), fmt.Sprintf("%.0f µs (Debezium)", deb),
			strings.Join(ratios, " / "), goalPeersCPU.text, verdict(met)}
	}
	// Runs before issue 33 measured CPU over all paced phases together.
	perRate := false
	for _, r := range in.res.Peers {
		for _, p := range r.Paced {
			perRate = perRate || p.RelayCPU > 0
		}
	}
	if !perRate {
		var ran []string
		for _, p := range pacedRates(in.res.Peers) {
			ran = append(ran, f0(float64(p)))
		}
		// The same events reach every relay, so over the phases together a
		// relay above the goal is above it at some rate, and the goal is
		// missed; at or below it, no rate is known to meet it.
		r := row(figure+"phases "+strings.Join(ran, " + ")+" events/s together (a run that measured no CPU per rate)",
			func(r PeerRun) (float64, bool) { return r.RelayCPUPaced, r.RelayCPUPaced > 0 })
		if r.verdict == "met" {
			r.verdict = "n/a"
		}
		return []headlineRow{r}
	}
	var out []headlineRow
	for _, rate := range peersGoalRates {
		label := figure + f0(float64(rate)) + " events/s"
		get := func(r PeerRun) (float64, bool) {
			for _, p := range r.Paced {
				if p.Rate == rate && p.RelayCPU > 0 {
					return p.RelayCPU, true
				}
			}
			return 0, false
		}
		if _, ok := meanOf("debezium", get); !ok {
			out = append(out, headlineRow{label, "not run in this invocation (`-peers-rates`)", "", "", goalPeersCPU.text, ""})
			continue
		}
		out = append(out, row(label, get))
	}
	return out
}

// peersAnchor is the peers section's heading as a Markdown anchor.
const peersAnchor = "debezium-beside-the-platforms-log-based-relay-generated-by-make-bench-bench_args-only-peers"

// headlineMarkdown is the headline section of BENCHMARKS.md.
func headlineMarkdown(in headlineInput) string {
	res, m := in.res, in.res.Machine
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n%s\n\n", headlineBeginMarker, headlineTitle)
	b.WriteString("| | |\n|---|---|\n")
	run := fmt.Sprintf("%s, %.1f minutes", m.Date, res.Seconds/60)
	if res.Revision != "" {
		run += fmt.Sprintf(", the tree at `%s`", res.Revision)
	}
	fmt.Fprintf(&b, "| run | %s |\n", run)
	fmt.Fprintf(&b, "| machine | %d CPUs (%s), %.1f GiB; `pg_test_fsync` fdatasync %s/s; %s; %s; Kafka %s |\n",
		m.CPUs, m.CPUModel, m.MemoryGB, f0(m.FsyncPerSec), m.Go, strings.SplitN(m.Postgres, " on ", 2)[0], m.Kafka)
	if res.CommitDelayUs > 0 {
		fmt.Fprintf(&b, "| disk | **slowed**: every k6 run's databases waited %d µs before each WAL flush (`-commit-delay-us`) |\n", res.CommitDelayUs)
	}
	if quiet, why := quietness(m.Load, m.CPUs); quiet {
		fmt.Fprintf(&b, "| quiet | yes: %s |\n", why)
	} else {
		fmt.Fprintf(&b, "| quiet | **no**: %s; every figure is pessimistic and not comparable with a quiet run's |\n", why)
	}
	if res.Base != "" {
		fmt.Fprintf(&b, "| BASE | `%s` (`-base`): every k6 scenario also ran against its programs in this run, alternated with this tree's |\n", res.Base)
	} else {
		b.WriteString("| BASE | none (`make bench BASE=<rev>` adds a same-run A/B) |\n")
	}
	var ran, not []string
	for _, p := range parts {
		if in.ran[p] {
			ran = append(ran, p)
		} else {
			not = append(not, p)
		}
	}
	fmt.Fprintf(&b, "| parts | %s; not run: %s |\n\n", strings.Join(ran, ", "), cmpOr(strings.Join(not, ", "), "none"))
	b.WriteString("| figure | measured | same-run baseline | ratio | goal | |\n|---|---|---|---|---|---|\n")
	for _, r := range headlineRows(in) {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.figure, r.measured, r.baseline, r.ratio, r.goal, r.verdict)
	}
	b.WriteString("\nThe goals are issue 33's, defined once (`loadtest/bench/cmd/bench/goals.go`); a row is met only when each\n" +
		"of its figures is. Every baseline ran in this invocation. How each figure is measured: [Method](#method).\n")
	if len(res.Problems) > 0 {
		fmt.Fprintf(&b, "**%d problem(s) in this run**: see the end of [the details](#the-latest-run-in-detail-generated).\n", len(res.Problems))
	}
	fmt.Fprintf(&b, "\n%s\n", headlineEndMarker)
	return b.String()
}

func cmpOr(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}
