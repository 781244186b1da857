package main

import (
	"bytes"
	"cmp"
	"fmt"
	"os"
	"strings"

	"github.com/onceflow/onceflow/loadtest/bench/rig"
)

func f0(v float64) string { return commas(fmt.Sprintf("%.0f", v)) }
func f1(v float64) string { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string { return fmt.Sprintf("%.2f", v) }

// commas groups an integer's digits by thousands.
func commas(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// resultsTable is the headline: each comparison as a ratio, with the raw
// numbers it divides and the goal it answers to.
func resultsTable(res Results) string {
	var b bytes.Buffer
	row := func(cells ...string) { fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | ")) }
	row("comparison", "measured", "baseline", "ratio", "goal", "")
	row("---", "---", "---", "---", "---", "---")
	missing := func(what string) { row(what, "not run", "", "", "", "") }

	if g, ok := res.Go["write"]; ok {
		m := g.Metrics
		row("write path: order + outbox vs bare order insert (tx/s)", f0(m["outbox-tx/s"])+" tx/s", f0(m["bare-tx/s"])+" tx/s",
			f2(m["ratio"]), "ratio ≥ 0.90", verdict(m["ratio"] >= 0.90))
		row("write path: p99 commit latency", f1(m["outbox-p99-ms"])+" ms", f1(m["bare-p99-ms"])+" ms",
			f2(ratio(m["outbox-p99-ms"], m["bare-p99-ms"])), "", "")
	} else {
		missing("write path")
	}
	if g, ok := res.Go["drain"]; ok {
		m := g.Metrics
		// The section's goals are both (BENCHMARKS.md: "≥ 20,000 events/s and
		// ratio ≥ 0.50"): a row is met only when every one is.
		row(fmt.Sprintf("relay drain of %s events vs raw kafka-go produce (events/s)", f0(cmp.Or(m["events"], 100_000))), f0(m["relay-events/s"])+" events/s",
			f0(m["raw-events/s"])+" events/s", f2(m["ratio"]), "≥ 20,000 events/s and ratio ≥ 0.50",
			verdict(m["relay-events/s"] >= 20000 && m["ratio"] >= 0.50))
	} else {
		missing("relay drain")
	}
	if g, ok := res.Go["consume"]; ok {
		m := g.Metrics
		row("billing consumption: 10% duplicates vs clean (events/s)", f0(m["dup-events/s"])+" events/s",
			f0(m["clean-events/s"])+" events/s", f2(m["ratio"]), "clean ≥ 10,000 events/s and ratio ≥ 0.90",
			verdict(m["clean-events/s"] >= 10000 && m["ratio"] >= 0.90))
	} else {
		missing("billing consumption")
	}
	cdcRows(res, row)
	out, okO := res.K6["outbox"]
	naive, okN := res.K6["naive"]
	switch {
	case okO && okN:
		row(fmt.Sprintf("end to end at %s orders/s offered: outbox vs naive dual write (orders/s)", f0(out.OfferedRate)),
			f0(out.OrdersPerSecond), f0(naive.OrdersPerSecond), f2(ratio(out.OrdersPerSecond, naive.OrdersPerSecond)), "", "")
		row("end to end: commit → settlement p99, outbox vs naive", f0(out.LagP99Ms)+" ms", f0(naive.LagP99Ms)+" ms",
			f2(ratio(out.LagP99Ms, naive.LagP99Ms)), "", "")
	case okO:
		row("end to end: outbox vs naive dual write", "naive mode not run", "", "", "", "")
	default:
		missing("end to end: outbox vs naive")
	}
	if okO {
		// One figure a row: the columns are measured / baseline / ratio,
		// and a p50 is none of the last two.
		steady := fmt.Sprintf("steady %s orders/s (outbox): ", f0(out.OfferedRate))
		row(steady+"achieved", f0(out.OrdersPerSecond)+" orders/s", "", "", "≥ 95 % of 1,000 offered",
			verdict(out.OfferedRate >= 1000 && out.OrdersPerSecond >= 950))
		row(steady+"commit → settlement p50", f0(out.LagP50Ms)+" ms", "", "", "", "")
		row(steady+"commit → settlement p99", f0(out.LagP99Ms)+" ms", "", "", "p99 ≤ 100 ms at 1,000 orders/s",
			verdict(out.OfferedRate >= 1000 && out.OrdersPerSecond >= 950 && out.LagP99Ms <= 100))
	}
	if r, ok := res.K6["ramp"]; ok {
		row("system: highest steady orders/s with commit → settlement p99 ≤ 100 ms (ramp knee)", f0(r.Knee)+" orders/s", "", "",
			"≥ 2,000 orders/s sustained; ≥ 1,000 at p99 ≤ 100 ms", verdict(r.Knee >= 2000))
	} else {
		missing("system knee (ramp)")
	}
	if s, ok := res.K6["spike"]; ok {
		row("spike: lag p99 over the whole run, backlog peak (orders outbox)", f0(s.LagP99Ms)+" ms",
			"peak "+f0(s.BacklogPeakOrders)+" rows", "", "", invariants(s))
		if ph := s.Phases; ph["before"] != nil && ph["spike"] != nil && ph["after"] != nil {
			row("spike: lag p99 of orders placed before / during / after the burst", fmt.Sprintf("%s / %s / %s ms",
				f0(ph["before"].LagP99Ms), f0(ph["spike"].LagP99Ms), f0(ph["after"].LagP99Ms)), "", "", "", "")
		}
	}
	if s, ok := res.K6["soak"]; ok {
		row(fmt.Sprintf("soak %s s at %s orders/s: lag p99", f0(s.LoadSeconds), f0(s.OfferedRate)), f0(s.LagP99Ms)+" ms", "", "", "", invariants(s))
	}
	lost, dup := 0.0, 0.0
	for _, r := range res.K6 {
		lost += r.Lost
		dup += r.Duplicated + r.ThirdPartyDuplicates
	}
	if len(res.K6) > 0 {
		row("invariants over every k6 run: lost / duplicated settlements", f0(lost)+" / "+f0(dup), "", "", "0 / 0", verdict(lost == 0 && dup == 0))
	}
	return b.String()
}

// cdcRows are the cdc part's rows (issue 15): the polling relay and the
// log-based relay's table (RELAY_MODE=cdc) and wal modes, each figure
// from one benchmark run. The polling relay has no goal here: it is the
// baseline the log-based modes are to beat.
func cdcRows(res Results, row func(...string)) {
	ran := false
	for _, kind := range []string{"write", "drain", "lag"} {
		for _, mode := range cdcModes {
			_, ok := res.Go["cdc-"+kind+"-"+mode]
			ran = ran || ok
		}
	}
	if !ran {
		row("relay modes poll / cdc (table) / wal", "not run", "", "", "", "")
		return
	}
	label := map[string]string{"poll": "poll", "table": "cdc (table)", "wal": "wal"}
	each := func(kind string, f func(mode string, m map[string]float64)) {
		for _, mode := range cdcModes {
			if g, ok := res.Go["cdc-"+kind+"-"+mode]; ok {
				f(mode, g.Metrics)
			} else {
				row(fmt.Sprintf("relay mode %s: %s", label[mode], kind), "not run", "", "", "", "")
			}
		}
	}
	each("write", func(mode string, m map[string]float64) {
		goal, met := "", ""
		switch mode {
		case "table":
			goal, met = "ratio ≥ 0.75", verdict(m["ratio"] >= 0.75)
		case "wal":
			goal, met = "ratio ≥ 0.95", verdict(m["ratio"] >= 0.95)
		}
		row(fmt.Sprintf("relay mode %s, write: order + event vs bare order insert (tx/s)", label[mode]),
			f0(m["event-tx/s"])+" tx/s", f0(m["bare-tx/s"])+" tx/s", f2(m["ratio"]), goal, met)
	})
	each("write", func(mode string, m map[string]float64) {
		row(fmt.Sprintf("relay mode %s, WAL bytes per event (write phase, over the bare insert's)", label[mode]),
			f0(m["wal-bytes/event"])+" B", "", "", "reported", "")
	})
	each("drain", func(mode string, m map[string]float64) {
		goal, met := "", ""
		if mode != "poll" {
			goal, met = "ratio ≥ 0.50", verdict(m["ratio"] >= 0.50)
		}
		row(fmt.Sprintf("relay mode %s, drain of %s events vs raw kafka-go produce (events/s)", label[mode], f0(m["events"])),
			f0(m["relay-events/s"])+" events/s", f0(m["raw-events/s"])+" events/s", f2(m["ratio"]), goal, met)
	})
	each("lag", func(mode string, m map[string]float64) {
		goal, met := "", ""
		if mode != "poll" {
			goal, met = "p99 ≤ 5 ms, no polling", verdict(m["ack-p99-ms"] <= 5)
		}
		lag := fmt.Sprintf("relay mode %s, commit → Kafka ack lag at %s events/s: ", label[mode], f0(m["events/s"]))
		row(lag+"p50", f1(m["ack-p50-ms"])+" ms", "", "", "", "")
		row(lag+"p99", f1(m["ack-p99-ms"])+" ms", "", "", goal, met)
	})
}

func invariants(r rig.Report) string {
	if r.Lost == 0 && r.Duplicated == 0 && r.ThirdPartyDuplicates == 0 {
		return "none lost or doubled"
	}
	return fmt.Sprintf("**%s lost, %s doubled**", f0(r.Lost), f0(r.Duplicated+r.ThirdPartyDuplicates))
}

const (
	beginMarker      = "<!-- make bench: generated results begin -->"
	endMarker        = "<!-- make bench: generated results end -->"
	knobsBeginMarker = "<!-- make bench -only knobs: generated results begin -->"
	knobsEndMarker   = "<!-- make bench -only knobs: generated results end -->"
)

// knobsMarkdown is the generated section of the knobs part.
func knobsMarkdown(res Results, o options) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n### Platform knobs (generated by `make bench BENCH_ARGS=-only=knobs`)\n\n", knobsBeginMarker)
	fmt.Fprintf(&b, "Run on %s, load %s when it started. Steady %s orders/s for %s per run, one setting changed at a time;\n",
		res.Machine.Date, res.Machine.Load, f0(res.Knobs[0].Report.OfferedRate), o.steadyDuration)
	b.WriteString("the default runs first and last, and ratios divide by their mean.\n\n")
	b.WriteString(knobTable(res.Knobs))
	fmt.Fprintf(&b, "\n%s\n", knobsEndMarker)
	return b.String()
}

// markdown is the generated section of BENCHMARKS.md.
func markdown(res Results, o options, table string) string {
	var b bytes.Buffer
	m := res.Machine
	fmt.Fprintf(&b, "%s\n## `make bench`: the latest run (generated)\n\n", beginMarker)
	fmt.Fprintf(&b, "Written by `make bench` (loadtest/bench/cmd/bench) on %s in %.1f minutes; everything between the markers is\n", m.Date, res.Seconds/60)
	fmt.Fprintf(&b, "replaced by the next run. Raw numbers: [`%s`](%s); lag over time of the steady run: [`%s`](%s).\n\n", o.jsonOut, o.jsonOut, o.svgOut, o.svgOut)
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %.1f GiB, load %s when it started; %s; %s; Kafka %s; `pg_test_fsync` fdatasync %s/s.\n",
		m.CPUs, m.CPUModel, m.MemoryGB, m.Load, m.Go, strings.SplitN(m.Postgres, " on ", 2)[0], m.Kafka, f0(m.FsyncPerSec))
	// Whether the run may be called quiet is the load's to say, not the
	// writer's: a busy start makes every figure below pessimistic.
	if quiet, why := quietness(m.Load, m.CPUs); quiet {
		fmt.Fprintf(&b, "On a quiet machine: %s.\n\n", why)
	} else {
		fmt.Fprintf(&b, "**Not a quiet machine**: %s; the figures below are pessimistic and not comparable with a quiet run's.\n\n", why)
	}
	b.WriteString(table)
	if len(res.Runs) > 0 {
		b.WriteString("\n### End-to-end figures and goals (issue 12)\n\n")
		if res.Base != "" {
			fmt.Fprintf(&b, "Every figure also measured, in this same run, against the programs of `%s` (`-base`), alternated with\n"+
				"the working tree's; the ratio divides this tree's value by the base's.\n\n", res.Base)
		}
		b.WriteString("Steps, hops, CPU and relay counters come from the ramp's plateaus (`-steps`, each held " + o.stepDuration + ").\n" +
			"A hop runs from the upstream outbox row's `created_at` (`clock_timestamp()` at its INSERT, the transaction's last\n" +
			"statement, so the hop includes its COMMIT) to the downstream inbox row's `received_at` (`now()`: the start of the\n" +
			"consumer's transaction that applies or leases the event). CPU is `/proc/<pid>/stat` utime + stime per process over\n" +
			"the plateau, per order placed in it: the four programs, Postgres (the postmaster, its live children and the ones it\n" +
			"reaped, so the whole shared server), the Kafka broker's JVM, and k6. Relay costs are the relays' `outbox_relay_*`\n" +
			"counters over `outbox_published_total`; n/a where a relay has no such counter.\n\n")
		b.WriteString(goalsTable(res))
		if ab := abTable(res); ab != "" {
			b.WriteString("\nEach scenario against the base, as a whole (k6's report; the steady and soak runs' hops over their load; CPU over\nthe whole run):\n\n")
			b.WriteString(ab)
		}
		var measured []Run
		for _, r := range res.Runs {
			if len(r.Windows) > 0 {
				measured = append(measured, r)
			}
		}
		if len(measured) > 0 {
			b.WriteString("\nEvery run's windows (ramp: each step's plateau; steady and soak: the whole load), measured from the databases and /proc:\n\n")
			b.WriteString(windowsTable(measured))
			for _, r := range measured {
				if st := stagesTable(r.Windows); st != "" {
					fmt.Fprintf(&b, "\nWhere an order's time goes, %s: p50 / p99 of each step, from the databases' timestamps (stages.go says which):\n\n", r.label())
					b.WriteString(st)
				}
			}
		}
		if st := statementsTable(res.Runs); st != "" {
			b.WriteString("\nSQL statements per order placed, by program's database, over each whole run (pg_stat_statements, top level; statements.go):\n\n")
			b.WriteString(st)
		}
	}
	if r, ok := res.K6["ramp"]; ok && len(r.Steps) > 0 {
		b.WriteString("\nRamp steps (each held " + o.stepDuration + "; a step passes with lag p99 ≤ 100 ms and ≥ 95 % of the offered rate):\n\n")
		b.WriteString("| offered orders/s | achieved | lag p50 | lag p99 | |\n|---|---|---|---|---|\n")
		for _, s := range r.Steps {
			ok := "pass"
			if !s.OK {
				ok = "**fail**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s ms | %s ms | %s |\n", f0(s.Rate), f0(s.Achieved), f0(s.LagP50Ms), f0(s.LagP99Ms), ok)
		}
	}
	if len(res.K6) > 0 {
		b.WriteString("\nEvery k6 run (HTTP latency is `POST /orders`; backlog peaks are outbox rows pending):\n\n")
		b.WriteString("| run | offered | orders/s | HTTP p50 / p95 / p99 | lag p50 / p99 / max | outbox backlog peak orders / billing | consumer lag peak billing / shim | errors | lost / doubled | k6 exit |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
		for _, key := range []string{"outbox", "naive", "ramp", "spike", "soak"} {
			r, ok := res.K6[key]
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s / %s / %s ms | %s / %s / %s ms | %s / %s | %s / %s | %s | %s / %s | %d |\n",
				key, offered(r), f0(r.OrdersPerSecond), f1(r.HTTPP50Ms), f1(r.HTTPP95Ms), f1(r.HTTPP99Ms),
				f0(r.LagP50Ms), f0(r.LagP99Ms), f0(r.LagMaxMs), f0(r.BacklogPeakOrders), f0(r.BacklogPeakBilling),
				f0(r.ConsumerLagPeakBilling), f0(r.ConsumerLagPeakShim),
				f0(r.Errors), f0(r.Lost), f0(r.Duplicated+r.ThirdPartyDuplicates), r.ExitCode)
		}
	}
	if len(res.Runs) > 0 {
		b.WriteString("\nCPU per order placed over each whole k6 run (load, drain and audit), by process (µs; /proc/<pid>/stat for the\n" +
			"programs, Postgres (the whole server, shared with anything else on it) and Kafka; k6's rusage):\n\n")
		b.WriteString(cpuTable(res.Runs))
	}
	if len(res.Lag) > 0 {
		fmt.Fprintf(&b, "\n![commit → settlement lag over time, steady run](%s)\n", o.svgOut)
	}
	if len(res.Missed) > 0 {
		b.WriteString("\nScenario thresholds missed (goals, not invariants):\n\n")
		for _, m := range res.Missed {
			fmt.Fprintf(&b, "- %s\n", m)
		}
	}
	if len(res.Problems) > 0 {
		b.WriteString("\nProblems in this run:\n\n")
		for _, p := range res.Problems {
			fmt.Fprintf(&b, "- %s\n", strings.ReplaceAll(p, "\n", " "))
		}
	}
	fmt.Fprintf(&b, "\n%s\n", endMarker)
	return b.String()
}

func offered(r rig.Report) string {
	switch r.Scenario {
	case "ramp":
		return "steps"
	case "spike":
		return "100 → spike → 100"
	}
	return f0(r.OfferedRate)
}

// writeMarkdown replaces the generated section of path between begin and
// end, or appends it.
func writeMarkdown(path, section, beginMarker, endMarker string) error {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, beginMarker), strings.Index(s, endMarker)
	if i >= 0 && j > i {
		s = s[:i] + strings.TrimSuffix(section, "\n") + s[j+len(endMarker):]
	} else {
		s = strings.TrimRight(s, "\n") + "\n\n" + section
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

func knobTable(knobs []Knob) string {
	var base rig.Report
	nBase := 0.0
	for _, k := range knobs {
		if k.Name == "default" {
			base.OrdersPerSecond += k.Report.OrdersPerSecond
			base.LagP50Ms += k.Report.LagP50Ms
			base.LagP99Ms += k.Report.LagP99Ms
			nBase++
		}
	}
	if nBase > 0 {
		base.OrdersPerSecond /= nBase
		base.LagP50Ms /= nBase
		base.LagP99Ms /= nBase
	}
	var b bytes.Buffer
	b.WriteString("| run | orders/s | HTTP p99 | lag p50 | lag p99 | lag p50 ÷ default | lag p99 ÷ default | outbox backlog peak orders / billing | consumer lag peak billing / shim |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range knobs {
		r := k.Report
		fmt.Fprintf(&b, "| %s | %s | %s ms | %s ms | %s ms | %s | %s | %s / %s | %s / %s |\n", k.Name, f0(r.OrdersPerSecond), f1(r.HTTPP99Ms),
			f0(r.LagP50Ms), f0(r.LagP99Ms), f2(ratio(r.LagP50Ms, base.LagP50Ms)), f2(ratio(r.LagP99Ms, base.LagP99Ms)),
			f0(r.BacklogPeakOrders), f0(r.BacklogPeakBilling), f0(r.ConsumerLagPeakBilling), f0(r.ConsumerLagPeakShim))
	}
	return b.String()
}

func cpuTable(runs []Run) string {
	var b bytes.Buffer
	cols := append(append([]string{}, cpuGroups...), cpuPrograms, cpuAllButK6)
	b.WriteString("| run | " + strings.Join(cols, " | ") + " |\n|---|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, r := range runs {
		if len(r.CPUPerOrderUs) == 0 {
			continue
		}
		label := r.Key
		if r.Side != "" {
			label += " (" + r.Side + ")"
		}
		if r.Round > 0 {
			label += fmt.Sprintf(" #%d", r.Round+1)
		}
		cells := []string{label}
		for _, c := range cols {
			if v, ok := r.CPUPerOrderUs[c]; ok {
				cells = append(cells, f0(v))
			} else {
				cells = append(cells, "n/a")
			}
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
	}
	return b.String()
}
