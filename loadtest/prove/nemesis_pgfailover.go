package prove

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/loadtest/prove/check"
	"github.com/onceflow/onceflow/platform/harness"
)

// The Postgres failover fault (issue 32): the harness's stack runs a
// streaming standby (PG_REPLICATION=async or sync), and the fault fails
// over to it as a lost machine does. The standby first receives nothing
// for Hold (the primary's walsender is frozen), while the load goes on:
// with asynchronous replication the clients are told that orders
// committed which the standby never gets; with synchronous replication
// they wait. Then the primary dies (SIGKILL of every process), the standby
// is promoted, and the services follow it through their multi-host URLs
// (target_session_attrs=read-write) with no restart. The old primary is
// seeded again as the new primary's standby, so that a later step can
// fail over again.
//
// All three databases live on the one server, so orders, billing and the
// shim fail over together. What an asynchronous failover may take back,
// and what no failover may, is package check's rule (check/failover.go):
// the history's fault record carries the window (At to Until) and the
// replication (Mode).

// NemPGFailover is the fault kind (NEMESIS=pgfailover). It runs only when
// named, on a stack with a standby.
const NemPGFailover = check.FaultPGFailover

// pgHAKinds are the fault kinds that need a standby: never in the default
// set, since the default stack has none.
var pgHAKinds = []string{NemPGFailover}

// pgFailoverLag bounds how long the standby receives nothing before the
// crash.
const (
	pgFailoverLagMin = 1 * time.Second
	pgFailoverLagMax = 6 * time.Second
	// pgResumeBound is how long the fault waits for the platform to
	// resume after the promotion before it reports what did not.
	pgResumeBound = 90 * time.Second
)

// schedulePGFailover sets a pgfailover step's lag.
func schedulePGFailover(s *step, dur func(lo, hi time.Duration) time.Duration) {
	s.Target = "postgres"
	s.Hold = dur(pgFailoverLagMin, pgFailoverLagMax)
}

// pgFailover runs the fault and measures the resumption.
// pgFailoverMode is a failover's Mode in the history: the replication,
// then the words check/failover.go reads (check.ModeReplicated,
// check.ModeNoSlotSync).
func (n *nemesisRun) pgFailoverMode() string {
	mode := string(n.h.stack.HA)
	if n.h.opts.PublishReplicated {
		mode += " " + check.ModeReplicated
	}
	if os.Getenv("ONCEFLOW_PG_VERSION") != "17" {
		mode += " " + check.ModeNoSlotSync
	}
	return mode
}

func (n *nemesisRun) pgFailover(ctx context.Context, s step) (string, error) {
	stack := n.h.stack
	if stack.HA == PGNoStandby {
		return "skipped: the stack has no standby (PG_REPLICATION=async or sync)", nil
	}
	cctx := context.WithoutCancel(ctx)
	n.stackMu.Lock()
	rep, err := stack.Failover(cctx, s.Hold)
	n.stackMu.Unlock()
	if err != nil {
		return "failover failed", err
	}
	n.pgKilled.Store(s.At, [2]time.Time{rep.KilledAt.Add(-rep.LaggedFor), rep.KilledAt})
	// Marks taken once the standby is promoted: what moves after them was
	// done against the new primary (a log-based relay may have published,
	// while the standby lagged, what the old one decoded).
	before, err := n.resumeMarks(cctx)
	if err != nil {
		return "reading the marks after the promotion failed", err
	}
	seeded := false
	if n.h.opts.PublishReplicated {
		// Relays that publish only what a standby has publish nothing
		// until the promoted server has one: seed it first, and the
		// resumption includes the seeding, as it would in production.
		// The old primary's postmaster may still be a zombie that init has
		// not reaped, and Postgres refuses to start over its lock file
		// while that pid exists: try again for a while.
		n.stackMu.Lock()
		var err error
		_ = waitUntil(cctx, 20*time.Second, func() bool { err = stack.StartServers(cctx); return err == nil })
		n.stackMu.Unlock()
		if err != nil {
			return "seeding a new standby failed", fmt.Errorf("seeding a new standby: %w", err)
		}
		seeded = true
	}
	resumed := n.waitResumed(cctx, before, rep.KilledAt)
	detail := fmt.Sprintf("%s replication: (%.1fs waiting for the slots to be synchronized) the standby received nothing for %.1fs (%d bytes behind), "+
		"then the primary was killed; promoted %.1fs after the kill (logical slots on it: %s); resumed after the kill: %s",
		stack.HA, rep.SyncWait.Seconds(), rep.LaggedFor.Seconds(), rep.LagBytes, rep.PromotedAt.Sub(rep.KilledAt).Seconds(), rep.Slots, resumed)
	n.h.logf("    pgfailover: %s", detail)
	if seeded {
		return detail, nil
	}
	// A standby again, for the next failover: the old primary seeded anew.
	n.stackMu.Lock()
	defer n.stackMu.Unlock()
	if err := stack.StartServers(cctx); err != nil {
		return detail, fmt.Errorf("seeding a new standby: %w", err)
	}
	return detail, nil
}

// resumeMarks are the counters whose growth says a part of the platform
// works again: the orders topic's end (the orders relay), billing's
// committed offsets on it (billing's consumer), billing's topic's end
// (billing's relay), the third party's bookings (the shim).
type resumeMarks struct {
	ordersEnd, billingCommitted, billingEnd int64
	settlements                             int
}

func (n *nemesisRun) resumeMarks(ctx context.Context) (resumeMarks, error) {
	var m resumeMarks
	p := n.p
	brokers := n.h.stack.Brokers()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	sum := func(topic string) (int64, error) {
		ends, err := topicEnds(ctx, client, topic)
		var t int64
		for _, e := range ends {
			t += e
		}
		return t, err
	}
	var err error
	if m.ordersEnd, err = sum(p.OrdersTopic); err != nil {
		return m, err
	}
	if m.billingEnd, err = sum(p.BillingTop); err != nil {
		return m, err
	}
	lag, err := groupLag(ctx, brokers, p.Billing.env("CONSUMER_GROUP"), p.OrdersTopic)
	if err != nil {
		return m, err
	}
	m.billingCommitted = m.ordersEnd - lag
	var stats struct {
		Settlements int `json:"settlements"`
	}
	if err := harness.GetJSON(ctx, p.Recon.URL()+"/stats", &stats); err != nil {
		return m, err
	}
	m.settlements = stats.Settlements
	return m, nil
}

// waitResumed polls until each part moved past its mark (and the orders
// API answers /readyz), and says how long after the kill each took.
func (n *nemesisRun) waitResumed(ctx context.Context, before resumeMarks, killed time.Time) string {
	parts := []string{"api ready", "orders relay", "billing consumer", "billing relay", "third party"}
	took := map[string]time.Duration{}
	_ = waitUntil(ctx, pgResumeBound, func() bool {
		if _, ok := took["api ready"]; !ok && httpOK(ctx, n.p.API.URL()+"/readyz") {
			took["api ready"] = time.Since(killed)
		}
		if m, err := n.resumeMarks(ctx); err == nil {
			for name, moved := range map[string]bool{
				"orders relay": m.ordersEnd > before.ordersEnd, "billing consumer": m.billingCommitted > before.billingCommitted,
				"billing relay": m.billingEnd > before.billingEnd, "third party": m.settlements > before.settlements,
			} {
				if _, ok := took[name]; !ok && moved {
					took[name] = time.Since(killed)
				}
			}
		}
		return len(took) == len(parts)
	})
	var out []string
	for _, name := range parts {
		if d, ok := took[name]; ok {
			out = append(out, fmt.Sprintf("%s %.1fs", name, d.Seconds()))
		} else {
			out = append(out, fmt.Sprintf("%s not within %s", name, pgResumeBound))
		}
	}
	return strings.Join(out, ", ")
}

func httpOK(ctx context.Context, url string) bool {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// pgWindow is when step s's standby stopped receiving and when its
// primary died: what an asynchronous failover may take back
// (check/failover.go); ok is false if the failover did not happen.
func (n *nemesisRun) pgWindow(s step) (from time.Time, seconds float64, ok bool) {
	v, ok := n.pgKilled.Load(s.At)
	if !ok {
		return time.Time{}, 0, false
	}
	w := v.([2]time.Time)
	return w[0], w[1].Sub(w[0]).Seconds(), true
}

// isPGHAKind reports whether k is one of pgHAKinds.
func isPGHAKind(k string) bool { return slices.Contains(pgHAKinds, k) }
