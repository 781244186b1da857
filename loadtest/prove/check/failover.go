package check

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The rules for a Postgres failover (issue 32).
//
// A fault record with Fault FaultPGFailover is a failover of the server
// that holds all three databases: At is when the standby stopped receiving,
// At+Seconds when the primary died, Mode the replication ("sync" or
// "async").
//
//   - Synchronous replication: a commit returns only once the standby has
//     it, so a failover may take back only what no client was told
//     committed. Every rule stands as without it: an acknowledged order
//     missing is an atomicity finding.
//   - Asynchronous replication: what committed while the standby lagged is
//     gone, acknowledged or not. An order whose loss (an acknowledged
//     placement or cancellation missing from the database, a charge, an
//     inbox row or a forward missing downstream) touches the window is
//     counted as taken back (Result.TakenBack), not found. Two things stay
//     findings, because the platform can prevent them: an effect outside
//     Postgres of an order the database no longer has (an event published
//     from a commit the standby never received: what PG 17's
//     synchronized_standby_slots stops for the log-based relays), and any
//     duplicate or order violation (a redone charge must be the same
//     payment under the same key).
//   - Asynchronous replication with the services holding back what the
//     standby does not have (Mode's word "replicated": the relays publish
//     and the consumers commit offsets only past what the standby flushed):
//     then a loss downstream of an order the database kept is the
//     platform's too, since what was consumed and lost is read again. An
//     order that survived keeps every finding, except in WAL-only mode
//     when the server has no failover slots (Mode's word "noslotsync":
//     PostgreSQL before 17), where the events committed and not yet
//     published when the slot went are lost, as documented
//     (outbox_slot_lost_unrecoverable_total).
const FaultPGFailover = "pgfailover"

// The words a pgfailover fault's Mode may hold after its replication.
const (
	ModeReplicated = "replicated" // the services run with Standby.PublishReplicated and CommitReplicated
	ModeNoSlotSync = "noslotsync" // the promoted server has no copy of a logical slot (before PostgreSQL 17)
)

// failoverSlack widens a window at both ends: a commit acknowledged at the
// edge, a timestamp taken a moment off.
const failoverSlack = 5 * time.Second

// window is an asynchronous failover's exposure, and what the platform
// held back across it (the words of its Mode).
type window struct {
	from, to time.Time
	// keptSurvivors: the services held back what the standby did not have,
	// so an order the database kept loses nothing downstream either.
	keptSurvivors bool
}

// asyncWindows are the exposures of the asynchronous failovers in faults;
// relayMode is the run's (Result.Mode).
func asyncWindows(faults []Record, relayMode string) []window {
	var out []window
	for _, f := range faults {
		words := strings.Fields(f.Mode)
		if f.Fault != FaultPGFailover || len(words) == 0 || words[0] != "async" || f.At.IsZero() {
			continue
		}
		killed := f.At.Add(time.Duration(f.Seconds * float64(time.Second)))
		w := window{from: f.At.Add(-failoverSlack), to: killed.Add(failoverSlack)}
		w.keptSurvivors = slices.Contains(words, ModeReplicated) && (relayMode != "wal" || !slices.Contains(words, ModeNoSlotSync))
		out = append(out, w)
	}
	return out
}

// exposed returns the first of ws that any of the order's timed records (a
// client's call, a message, a booking) falls in.
func (v *orderView) exposed(ws []window) (window, bool) {
	for _, r := range v.records {
		switch r.Kind {
		case KindPlace, KindCancel, KindMessage, KindBooking:
		default:
			continue
		}
		for _, w := range ws {
			if !r.At.Before(w.from) && !r.At.After(w.to) {
				return w, true
			}
		}
	}
	return window{}, false
}

// takenBack splits an exposed order's findings into those an asynchronous
// failover explains (losses inside Postgres) and those it does not. An
// order the orders database no longer has while its effects exist outside
// Postgres keeps its atomicity findings: published from a commit the
// standby never had. An order the database kept keeps every finding when
// the services held back what the standby did not have (w.keptSurvivors).
func (v *orderView) takenBack(fs []Finding, w window) (kept []Finding, excused int) {
	if w.keptSurvivors && v.row != nil {
		for i := range fs {
			fs[i].What += " (the order survived the asynchronous failover, and the services held back what the standby did not have: nothing downstream of it may be lost)"
		}
		return fs, 0
	}
	escaped := v.row == nil && (countType(distinctEvents(v.messages["orders"]), orderPlaced) > 0 || v.charge != nil || len(v.bookings) > 0)
	for _, f := range fs {
		switch {
		case f.Kind == Atomicity && escaped:
			f.What += " (its effects left Postgres before an asynchronous failover took the order back: published from a commit the standby never had)"
			kept = append(kept, f)
		case f.Kind == Atomicity, f.Kind == Loss, f.Kind == Unresolved:
			excused++
		default:
			kept = append(kept, f)
		}
	}
	return kept, excused
}

// reconcileLine is one kind of the end-of-run reconciliation's report
// (prove's reconcileReport.problems): kind in component: count (samples).
var reconcileLine = regexp.MustCompile(`^(\S+) in (\S+): (\d+)(?: \(([^)]*)\))?$`)

// reconciledTakenBack reports whether every line of an end-of-run
// reconciliation report names only orders an asynchronous failover took
// back, all of them listed: billing's charge of an order whose
// OrderPlaced was consumed, its Kafka offset committed, and its commit lost
// (the offset is outside Postgres and survives). The report finding them
// is the platform saying so, as it should; they are counted as taken
// back, not found.
func reconciledTakenBack(detail string, takenBack map[string]bool) bool {
	if len(takenBack) == 0 || detail == "" {
		return false
	}
	for _, line := range strings.Split(detail, "; ") {
		m := reconcileLine.FindStringSubmatch(line)
		if m == nil || m[4] == "" {
			return false
		}
		ids := strings.Split(m[4], ", ")
		if n, _ := strconv.Atoi(m[3]); n != len(ids) {
			return false // not all listed: cannot tell
		}
		for _, id := range ids {
			if !takenBack[id] {
				return false
			}
		}
	}
	return true
}
