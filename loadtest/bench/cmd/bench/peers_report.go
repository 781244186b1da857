package main

import (
	"bytes"
	"fmt"
	"strings"
)

const (
	peersBeginMarker = "<!-- make bench -only peers: generated results begin -->"
	peersEndMarker   = "<!-- make bench -only peers: generated results end -->"
)

// peerColumns are the table's columns: each relay with what it is.
var peerColumns = []struct{ relay, title string }{
	{"debezium", "Debezium 3.1.3 (Kafka Connect 3.9.1)"},
	{"cdc", "platform, RELAY_MODE=cdc (table)"},
	{"wal", "platform, RELAY_MODE=wal (WAL only)"},
}

// peersTable is the peers part's figures, one column per relay, each the
// mean over the rounds, with the rounds' range when there are several; then
// the big transaction's, when it ran.
func peersTable(runs []PeerRun, big []PeerBig) string {
	by := map[string][]PeerRun{}
	for _, r := range runs {
		by[r.Relay] = append(by[r.Relay], r)
	}
	var b bytes.Buffer
	b.WriteString("| figure |")
	for _, c := range peerColumns {
		fmt.Fprintf(&b, " %s |", c.title)
	}
	b.WriteString("\n|---|")
	b.WriteString(strings.Repeat("--:|", len(peerColumns)))
	b.WriteString("\n")
	row := func(name string, cell func(PeerRun) float64, format func(float64) string) {
		fmt.Fprintf(&b, "| %s |", name)
		for _, c := range peerColumns {
			fmt.Fprintf(&b, " %s |", spread(by[c.relay], cell, format))
		}
		b.WriteString("\n")
	}
	seconds := func(v float64) string { return fmt.Sprintf("%.2f s", v) }
	ms := func(v float64) string { return fmt.Sprintf("%.0f ms", v) }
	us := func(v float64) string { return fmt.Sprintf("%.1f µs", v) }
	drain := 0
	if len(runs) > 0 {
		drain = runs[0].DrainEvents
	}
	row(fmt.Sprintf("drain of a %s-event transaction, cold (commit → last record appended)", f0(float64(drain))),
		func(r PeerRun) float64 { return r.DrainCold }, seconds)
	row("the same, warm (a second one, same process)", func(r PeerRun) float64 { return r.DrainWarm }, seconds)
	row("pg_recvlogical alone on a slot of its own, the same two transactions, cold (commit → its COMMIT read)",
		func(r PeerRun) float64 { return r.RecvCold }, seconds)
	row("… warm", func(r PeerRun) float64 { return r.RecvWarm }, seconds)
	row("drain rate ÷ pg_recvlogical's, cold", func(r PeerRun) float64 { return ratio(r.RecvCold, r.DrainCold) }, f2)
	row("… warm", func(r PeerRun) float64 { return ratio(r.RecvWarm, r.DrainWarm) }, f2)
	for i, p := range pacedRates(runs) {
		i := i
		pick := func(get func(PeerPaced) float64) func(PeerRun) float64 {
			return func(r PeerRun) float64 {
				if i < len(r.Paced) {
					return get(r.Paced[i])
				}
				return 0
			}
		}
		row(fmt.Sprintf("paced %s events/s from 8 connections: commit → append p50", f0(float64(p))), pick(func(x PeerPaced) float64 { return x.P50 }), ms)
		row("… p99", pick(func(x PeerPaced) float64 { return x.P99 }), ms)
		row("… max", pick(func(x PeerPaced) float64 { return x.Max }), ms)
		row("… events not on the topic", pick(func(x PeerPaced) float64 { return float64(x.Missed) }), f0)
		if perRateCPU(runs) {
			row("… CPU per event: the relay's process", pick(func(x PeerPaced) float64 { return x.RelayCPU }), us)
			row("… its walsender", pick(func(x PeerPaced) float64 { return x.WalsenderCPU }), us)
		}
	}
	row("CPU per event, drains: the relay's process", func(r PeerRun) float64 { return r.RelayCPUDrain }, us)
	row("… its walsender (Postgres decoding the slot)", func(r PeerRun) float64 { return r.WalsenderCPUDrain }, us)
	row("CPU per event, all paced phases: the relay's process", func(r PeerRun) float64 { return r.RelayCPUPaced }, us)
	row("… its walsender", func(r PeerRun) float64 { return r.WalsenderCPUPaced }, us)
	row("peak RSS of the relay's process", func(r PeerRun) float64 { return float64(r.PeakRSS) / (1 << 20) },
		func(v float64) string { return fmt.Sprintf("%.0f MiB", v) })
	row("idle CPU of the relay's process (% of one core)", func(r PeerRun) float64 { return r.IdleCPU },
		func(v float64) string { return fmt.Sprintf("%.1f %%", v) })
	row("start → streaming from its slot", func(r PeerRun) float64 { return r.StartSeconds }, seconds)
	if len(big) > 0 {
		bigRows(&b, big)
	}
	return b.String()
}

// bigRows are the big transaction's rows: each relay's one drain, its
// rate over Debezium's and its process's peak RSS.
func bigRows(b *bytes.Buffer, big []PeerBig) {
	by := map[string]PeerBig{}
	for _, r := range big {
		by[r.Relay] = r
	}
	row := func(name string, cell func(r PeerBig) string) {
		fmt.Fprintf(b, "| %s |", name)
		for _, c := range peerColumns {
			r, ok := by[c.relay]
			if !ok {
				b.WriteString(" – |")
				continue
			}
			fmt.Fprintf(b, " %s |", cell(r))
		}
		b.WriteString("\n")
	}
	row(fmt.Sprintf("one %s-event transaction, a fresh process (Debezium: a cold JVM): drain rate (commit → last record appended)", f0(float64(big[0].Events))),
		func(r PeerBig) string { return fmt.Sprintf("%s events/s (%.2f s)", f0(r.rate()), r.Seconds) })
	deb, ok := by["debezium"]
	row("… ÷ Debezium's", func(r PeerBig) string {
		if !ok || r.Relay == "debezium" {
			return "–"
		}
		return fmt.Sprintf("%.2f×", ratio(r.rate(), deb.rate()))
	})
	row("… peak RSS of the relay's process", func(r PeerBig) string { return mib(r.PeakRSS) })
}

// perRateCPU reports whether runs measured CPU per paced phase (runs
// before issue 33 measured it over all the phases together only).
func perRateCPU(runs []PeerRun) bool {
	for _, r := range runs {
		for _, p := range r.Paced {
			if p.RelayCPU > 0 {
				return true
			}
		}
	}
	return false
}

// pacedRates are the paced phases' rates, as the first run has them.
func pacedRates(runs []PeerRun) []int {
	if len(runs) == 0 {
		return nil
	}
	var rates []int
	for _, p := range runs[0].Paced {
		rates = append(rates, p.Rate)
	}
	return rates
}

// spread is the mean of cell over runs, with the range when they differ.
func spread(runs []PeerRun, cell func(PeerRun) float64, format func(float64) string) string {
	if len(runs) == 0 {
		return "–"
	}
	lo, hi, sum := cell(runs[0]), cell(runs[0]), 0.0
	for _, r := range runs {
		v := cell(r)
		lo, hi, sum = min(lo, v), max(hi, v), sum+v
	}
	mean := format(sum / float64(len(runs)))
	if len(runs) == 1 || format(lo) == format(hi) {
		return mean
	}
	return fmt.Sprintf("%s (%s–%s)", mean, format(lo), format(hi))
}

// peersMarkdown is the generated section of the peers part.
func peersMarkdown(res Results, o options, table string) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n### Debezium beside the platform's log-based relay (generated by `make bench BENCH_ARGS=\"-only peers\"`)\n\n", peersBeginMarker)
	fmt.Fprintf(&b, "Run on %s, load %s when it started; %d round(s), each running every relay once as its own process, "+
		"the first relay changing from round to round; each cell is the mean of the rounds (their range in brackets). "+
		"Paced phases of %s each, idle window %s. Latencies are the broker's append time (LogAppendTime: milliseconds, "+
		"truncated) minus the moment the writer sent COMMIT; the drains' from the COMMIT to the last record's append. "+
		"Before each relay, PostgreSQL's `pg_recvlogical` drains the same two transactions alone (rows; WAL messages for wal) on a "+
		"database and slot of its own, reading pgoutput with the platform relay's options (proto_version 1, the outbox's publication, "+
		"messages), timed from the COMMIT to the bench's reading of the transaction's COMMIT message from its output: the walsender's "+
		"limit; each drain's rate divided by its rate is the relay's share of that limit.%s\n\n",
		res.Machine.Date, res.Machine.Load, peerRounds(res.Peers), o.peers.paced, o.peers.idle, bigNote(res.PeersBig))
	b.WriteString(table)
	fmt.Fprintf(&b, "\n%s\n", peersEndMarker)
	return b.String()
}

// peerRounds is how many rounds runs hold: the most runs of one relay.
func peerRounds(runs []PeerRun) int {
	n := map[string]int{}
	most := 0
	for _, r := range runs {
		n[r.Relay]++
		most = max(most, n[r.Relay])
	}
	return most
}

// bigNote says how the big transaction's rows were measured, when they were.
func bigNote(big []PeerBig) string {
	if len(big) == 0 {
		return ""
	}
	return fmt.Sprintf(" The last rows: after the rounds, each relay started afresh (Debezium: a new Kafka Connect, a cold JVM) "+
		"on a fresh database, slot and topic drained one %s-event transaction (`-peers-big`), and its process's peak RSS "+
		"(`VmHWM`) was read right after.", f0(float64(big[0].Events)))
}
