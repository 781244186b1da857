package main

import (
	"fmt"
	"strings"
	"time"
)

// stageNames are the steps of an order's path that the three databases'
// own timestamps tell apart (one server, one clock), in order. Together
// with the order's own transaction they make its commit → settlement lag:
//
//   - orders relay wait: orders' outbox row created_at (its INSERT, the
//     transaction's last statement, so the commit and its WAL flush are
//     in this step) → published_at (now() of the polling relay's claim
//     transaction, which marks the row in the same transaction);
//   - claim → billing tx: the claim, the produce and its ack, the relay's
//     mark and commit, the consumer's fetch, its worker queue, and the
//     start of billing's transaction (inbox received_at, now());
//   - billing tx: billing's handler up to its outbox row's INSERT;
//   - billing relay wait: that row's commit → billing relay's claim;
//   - claim → shim lease: as above, to the shim's lease transaction;
//   - shim lease → forwarded: the lease's commit, the call to the third
//     party, and the forward's record (forwards.forwarded_at).
//
// The Kafka part of a "claim →" step (produce, ack, fetch) is not
// recorded by any database; the programs' execution traces split it
// further (docs/operations.md).
var stageNames = [...]string{
	"orders relay wait",
	"claim → billing tx",
	"billing tx",
	"billing relay wait",
	"claim → shim lease",
	"shim lease → forwarded",
}

// StageStat is one step's latency over a window's orders.
type StageStat struct {
	Stage string `json:"stage"`
	HopStat
}

// orderStages computes an order's stages from the hop 1 event's
// created_at, published_at and billing's received_at, the hop 2 event's
// the same with the shim's received_at, and the settlement; a stage whose
// ends are not both known is -1.
func orderStages(o placedOrder, out1, pub1, recv1, out2, pub2, recv2 time.Time) [len(stageNames)]time.Duration {
	var s [len(stageNames)]time.Duration
	between := func(from, to time.Time) time.Duration {
		if from.IsZero() || to.IsZero() {
			return -1
		}
		return to.Sub(from)
	}
	s[0] = between(out1, pub1)
	s[1] = between(pub1, recv1)
	s[2] = between(recv1, out2)
	s[3] = between(out2, pub2)
	s[4] = between(pub2, recv2)
	s[5] = between(recv2, o.settled)
	return s
}

// stagesTable renders each window's stages as a markdown table, a row per
// offered rate, p50 / p99 in ms per stage; empty when no window has any.
func stagesTable(ws []Window) string {
	found := false
	for _, w := range ws {
		found = found || len(w.Stages) > 0
	}
	if !found {
		return ""
	}
	var b strings.Builder
	b.WriteString("| offered | " + strings.Join(stageNames[:], " | ") + " |\n|---")
	b.WriteString(strings.Repeat("|---", len(stageNames)) + "|\n")
	for _, w := range ws {
		cells := make([]string, len(stageNames))
		for i := range cells {
			cells[i] = "–"
		}
		for _, st := range w.Stages {
			for i, n := range stageNames {
				if n == st.Stage {
					cells[i] = fmt.Sprintf("%s / %s", formatValue(st.P50Ms, "ms"), formatValue(st.P99Ms, "ms"))
				}
			}
		}
		fmt.Fprintf(&b, "| %s/s | %s |\n", f0(w.Rate), strings.Join(cells, " | "))
	}
	return b.String()
}
