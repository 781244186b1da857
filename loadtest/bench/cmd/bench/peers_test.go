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
	for _, bad := range [][]string{{"-peers-rates", "200,x"}, {"-peers-rates", "0"}, {"-peers-rounds", "0"}, {"-peers-idle", "0s"}} {
		if _, err := parseFlags(append([]string{"bench"}, bad...), io.Discard); err == nil {
			t.Errorf("parseFlags accepted %v", bad)
		}
	}
	if o, _ := parseFlags([]string{"bench"}, io.Discard); o.only["peers"] {
		t.Error("plain make bench runs the peers part; it is asked for by name (it needs java)")
	}
}

// The table has a column per relay, the mean of the rounds with their
// range, and a dash for a relay that did not run.
func TestPeersTable(t *testing.T) {
	runs := []PeerRun{
		{Relay: "cdc", Round: 1, DrainEvents: 1000, DrainCold: 1, Paced: []PeerPaced{{Rate: 200, P50: 4, P99: 9, Max: 12}}, PeakRSS: 40 << 20},
		{Relay: "cdc", Round: 2, DrainEvents: 1000, DrainCold: 3, Paced: []PeerPaced{{Rate: 200, P50: 4, P99: 11, Max: 20}}, PeakRSS: 40 << 20},
		{Relay: "debezium", Round: 1, DrainEvents: 1000, DrainCold: 5, Paced: []PeerPaced{{Rate: 200, P50: 15, P99: 30, Max: 40}}, PeakRSS: 300 << 20},
	}
	table := peersTable(runs)
	for _, want := range []string{
		"| drain of a 1,000-event transaction, cold (commit → last record appended) | 5.00 s | 2.00 s (1.00 s–3.00 s) | – |",
		"| paced 200 events/s from 8 connections: commit → append p50 | 15 ms | 4 ms | – |",
		"| … p99 | 30 ms | 10 ms (9 ms–11 ms) | – |",
		"| peak RSS of the relay's process | 300 MiB | 40 MiB | – |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}
