package main

import (
	"io"
	"strings"
	"testing"
)

func TestPeersFlags(t *testing.T) {
	o, err := parseFlags([]string{"bench", "-only", "peers", "-peers-rates", "50, 400", "-peers-rounds", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.only["peers"] || len(o.only) != 1 || o.peers.rounds != 3 || len(o.peers.rates) != 2 || o.peers.rates[1] != 400 {
		t.Fatalf("parsed %+v", o)
	}
	if o.peers.big != 0 {
		t.Errorf("-peers-big defaults to %d; the big transaction is asked for", o.peers.big)
	}
	if o, err := parseFlags([]string{"bench", "-only", "peers", "-peers-big", "20000"}, io.Discard); err != nil || o.peers.big != 20000 {
		t.Errorf("-peers-big 20000: %v, %d", err, o.peers.big)
	}
	for _, bad := range [][]string{{"-peers-rates", "200,x"}, {"-peers-rates", "0"}, {"-peers-rounds", "0"}, {"-peers-idle", "0s"}, {"-peers-big", "-1"}} {
		if _, err := parseFlags(append([]string{"bench"}, bad...), io.Discard); err == nil {
			t.Errorf("parseFlags accepted %v", bad)
		}
	}
	if o, _ := parseFlags([]string{"bench"}, io.Discard); o.only["peers"] {
		t.Error("plain make bench runs the peers part; it is asked for by name (it needs java)")
	}
}

// The table has a column per relay, the mean of the rounds with their
// range, and a dash for a relay that did not run; each drain divided by
// pg_recvlogical's is a rate ratio (its seconds over the relay's); the big
// transaction's rows come only when it ran.
func TestPeersTable(t *testing.T) {
	runs := []PeerRun{
		{Relay: "cdc", Round: 1, DrainEvents: 1000, DrainCold: 1, RecvCold: 0.9, RecvWarm: 0.5, DrainWarm: 1,
			Paced: []PeerPaced{{Rate: 200, P50: 4, P99: 9, Max: 12}}, PeakRSS: 40 << 20},
		{Relay: "cdc", Round: 2, DrainEvents: 1000, DrainCold: 3, RecvCold: 2.1, RecvWarm: 0.5, DrainWarm: 1,
			Paced: []PeerPaced{{Rate: 200, P50: 4, P99: 11, Max: 20}}, PeakRSS: 40 << 20},
		{Relay: "debezium", Round: 1, DrainEvents: 1000, DrainCold: 5, RecvCold: 1, RecvWarm: 1, DrainWarm: 4,
			Paced: []PeerPaced{{Rate: 200, P50: 15, P99: 30, Max: 40}}, PeakRSS: 300 << 20},
	}
	table := peersTable(runs, nil)
	for _, want := range []string{
		"| drain of a 1,000-event transaction, cold (commit → last record appended) | 5.00 s | 2.00 s (1.00 s–3.00 s) | – |",
		"| pg_recvlogical alone on a slot of its own, the same two transactions, cold (commit → its COMMIT read) | 1.00 s | 1.50 s (0.90 s–2.10 s) | – |",
		"| drain rate ÷ pg_recvlogical's, cold | 0.20 | 0.80 (0.70–0.90) | – |",
		"| … warm | 0.25 | 0.50 | – |",
		"| paced 200 events/s from 8 connections: commit → append p50 | 15 ms | 4 ms | – |",
		"| … p99 | 30 ms | 10 ms (9 ms–11 ms) | – |",
		"| peak RSS of the relay's process | 300 MiB | 40 MiB | – |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, "CPU per event: the relay's process") {
		t.Errorf("per-rate CPU rows from runs that measured none:\n%s", table)
	}
	runs[0].Paced[0].RelayCPU, runs[1].Paced[0].RelayCPU, runs[2].Paced[0].RelayCPU = 100, 120, 400
	requireRow(t, "the table", peersTable(runs, nil), "| … CPU per event: the relay's process | 400.0 µs | 110.0 µs (100.0 µs–120.0 µs) | – |")
	if strings.Contains(table, "fresh process") {
		t.Errorf("the big transaction's rows without its run:\n%s", table)
	}

	big := []PeerBig{
		{Relay: "debezium", Events: 1_000_000, Seconds: 40, PeakRSS: 400 << 20},
		{Relay: "wal", Events: 1_000_000, Seconds: 8, PeakRSS: 50 << 20},
	}
	table = peersTable(runs, big)
	for _, want := range []string{
		"| one 1,000,000-event transaction, a fresh process (Debezium: a cold JVM): drain rate (commit → last record appended) | 25,000 events/s (40.00 s) | – | 125,000 events/s (8.00 s) |",
		"| … ÷ Debezium's | – | – | 5.00× |",
		"| … peak RSS of the relay's process | 400 MiB | – | 50 MiB |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}
