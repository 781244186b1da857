package prove

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"

	"github.com/onceflow/onceflow/loadtest/prove/check"
)

// The nemesis (issue 20): the platform production-shaped under steady load
// with cancellations, while a seeded random schedule combines faults of
// every kind, often several at once; every order's life is recorded from
// outside the services, read back from the databases, the topics and the
// ledger, and judged by package check, which shares no code with the
// libraries.

// The fault kinds (NEMESIS=…).
const (
	NemPause      = "pause"      // SIGSTOP an instance past its lease and session, then SIGCONT
	NemKill       = "kill"       // SIGKILL an instance (the supervisor restarts it)
	NemMember     = "member"     // an instance leaves (SIGTERM) and comes back, or one more joins and leaves
	NemKafka      = "kafka"      // Kafka stopped for a while, or restarted
	NemPostgres   = "postgres"   // PostgreSQL restarted, or stopped for a while
	NemNet        = "net"        // toxiproxy: latency, connections timing out, resets, cuts
	NemThirdParty = "thirdparty" // the third party slow, answering 500s, booking then hanging, rejecting (422)
	NemSlot       = "slot"       // the replication slot dropped (log-based modes only)
	NemOperator   = "operator"   // dead-letter requeue-all, outbox requeue, replay dryRun:false, make reconcile
	NemLimit      = "limit"      // the orders topic's max.message.bytes lowered between the sizes of OrderCancelled and OrderPlaced
	NemFailover   = "failover"   // billing's database fails over during a migration's lock and a scale-up of billing (nemesis_failover.go)
)

// NemesisKinds are every fault kind, in the order the schedule weighs them.
var NemesisKinds = []string{NemPause, NemKill, NemMember, NemKafka, NemPostgres, NemNet, NemThirdParty, NemSlot, NemOperator, NemLimit, NemFailover}

// NemesisOptions configure the nemesis proof.
type NemesisOptions struct {
	// Seed chooses the schedule; the same seed replays the same schedule.
	// 0: one from the clock (printed).
	Seed int64
	// Duration is how long faults run under load. Default the profile's.
	Duration time.Duration
	// Kinds chooses fault kinds ("pause,thirdparty") or excludes them
	// ("-kafka,-postgres"). Empty: every kind.
	Kinds []string
	// Targets narrows the faults on instances (pause, kill, member) to the
	// kinds of instance named: orders, billing, shim (NEMESIS_TARGETS=).
	// Empty: every instance.
	Targets []string
	// Topology is the Kafka the harness's stack runs (NEMESIS_TOPOLOGY=):
	// "" one broker, "ha" a cluster of three with the cluster fault kinds
	// (nemesis_cluster.go). It is the whole run's stack, so every proof of
	// the run uses it.
	Topology string
}

// nemesis timing. The shim's lease is 3 × its RECONCILER_TIMEOUT (see the
// shim's run.go): 700ms makes it 2.1s, short enough that a pause or a slow
// third party outlives it. The consumer groups' session timeout is the
// inbox's default, 10s: pauses run 12–25s so that a paused member's
// partitions move to another member while it still holds its work.
const (
	nemReconcilerTimeout = "700ms"
	nemMaxInFlight       = "2"
	nemPauseMin          = 12 * time.Second
	nemPauseMax          = 25 * time.Second
	// nemDrainBound is the liveness bound: after the faults stop, every
	// consumer group's lag reaches 0 and both outboxes drain within it.
	nemDrainBound = 3 * time.Minute
	// nemRate is the steady load, orders per second; every 4th is
	// cancelled right after it is placed.
	nemRate        = 8
	nemCancelEvery = 4
)

// chosenKinds applies opts.Kinds to NemesisKinds; slot only in log-based modes.
func chosenKinds(sel []string, relayMode string) ([]string, error) {
	var include, exclude []string
	for _, k := range sel {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		name := strings.TrimPrefix(k, "-")
		if !slices.Contains(NemesisKinds, name) && !slices.Contains(NemesisOptInKinds, name) && !isPGHAKind(name) && !slices.Contains(NemClusterKinds, name) {
			return nil, fmt.Errorf("NEMESIS: no fault kind %q (there are %s; named only: %s; with PG_REPLICATION: %s; with NEMESIS_TOPOLOGY=ha: %s)", name,
				strings.Join(NemesisKinds, ", "), strings.Join(NemesisOptInKinds, ", "), strings.Join(pgHAKinds, ", "), strings.Join(NemClusterKinds, ", "))
		}
		if strings.HasPrefix(k, "-") {
			exclude = append(exclude, name)
		} else {
			include = append(include, name)
		}
	}
	var out []string
	for _, k := range slices.Concat(NemesisKinds, pgHAKinds, NemClusterKinds) {
		if (len(include) > 0 && !slices.Contains(include, k)) || slices.Contains(exclude, k) {
			continue
		}
		if isPGHAKind(k) && !slices.Contains(include, k) {
			continue // only named: it needs a stack with a standby
		}
		if slices.Contains(NemClusterKinds, k) && !slices.Contains(include, k) {
			continue // named, or added by NEMESIS_TOPOLOGY=ha (withTopology)
		}
		if k == NemSlot && relayMode == "poll" {
			continue // nothing to drop: the polling relay has no slot
		}
		if (k == NemSlot || k == NemLimit) && relayMode == "wal" && !slices.Contains(include, k) {
			// WAL-only mode has no row to republish a lost slot's window
			// from, nor to hold a refused event's aggregate back with: the
			// loss and the gap are its documented price (runbook-cdc.md),
			// which is all these faults could show there. Named in
			// NEMESIS=, they run, to show it.
			continue
		}
		out = append(out, k)
	}
	out = append(out, optInKinds(include, relayMode)...) // nemesis_outbox.go
	if len(out) == 0 {
		return nil, fmt.Errorf("NEMESIS=%s leaves no fault kind for RELAY_MODE=%s", strings.Join(sel, ","), relayMode)
	}
	return out, nil
}

// step is one fault of the schedule: at At after the start, Kind on Target
// for Hold, with Params.
type step struct {
	At     time.Duration
	Kind   string
	Target string
	Hold   time.Duration
	Param  string
	N      int
}

func (s step) String() string {
	d := fmt.Sprintf("+%5.1fs %-10s", s.At.Seconds(), s.Kind)
	if s.Target != "" {
		d += " " + s.Target
	}
	if s.Param != "" {
		d += " " + s.Param
	}
	if s.N > 0 {
		d += fmt.Sprintf(" n=%d", s.N)
	}
	if s.Hold > 0 {
		d += fmt.Sprintf(" for %.1fs", s.Hold.Seconds())
	}
	return d
}

// The instances the schedule names; a target that is not running when its
// step comes (stopped by an earlier step) is skipped, and the history says so.
var (
	nemInstances = []string{"orders-1", "orders-2", "billing", "billing-2", "shim", "shim-2"}
	nemToxics    = []string{"latency", "timeout", "reset_peer", "cut"}
	nemTPFaults  = []string{"slow", "fail", "hang", "reject"}
	nemOperator  = []string{"dlq-requeue-all", "outbox-requeue", "replay", "reconcile"}
)

// schedule draws the whole schedule from seed before anything runs, so the
// same seed gives the same schedule whatever the machine's timing.
func schedule(seed int64, kinds []string, d time.Duration, targets []string) []step {
	instances, joiners := nemInstances, []string{KindRelay, KindBilling, KindShim}
	if len(targets) > 0 {
		keep := func(name string) bool {
			return slices.ContainsFunc(targets, func(t string) bool { return strings.HasPrefix(name, strings.TrimSpace(t)) })
		}
		instances = slices.DeleteFunc(slices.Clone(nemInstances), func(n string) bool { return !keep(n) })
		joiners = slices.DeleteFunc(joiners, func(n string) bool { return !keep(n) })
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6f6e6365666c6f77)) // "onceflow"
	dur := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)).Round(100*time.Millisecond)
	}
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
	var out []step
	// The load runs alone for the first seconds, so that every instance
	// has work in hand when the first fault comes.
	for at := dur(5*time.Second, 8*time.Second); at < d; at += dur(2*time.Second, 7*time.Second) {
		s := step{At: at, Kind: pick(kinds)}
		switch s.Kind {
		case NemPause:
			s.Target, s.Hold = pick(instances), dur(nemPauseMin, nemPauseMax)
		case NemKill:
			if len(targets) == 0 {
				s.Target = pick(append(slices.Clone(instances), "orders-api"))
			} else {
				s.Target = pick(instances)
			}
		case NemMember:
			s.Param = pick([]string{"leave", "join"})
			if s.Param == "leave" {
				s.Target = pick(instances)
			} else {
				s.Target = pick(joiners)
			}
			s.Hold = dur(8*time.Second, 25*time.Second)
		case NemKafka:
			s.Param = pick([]string{"stop", "restart"})
			if s.Param == "stop" {
				s.Hold = dur(5*time.Second, 30*time.Second)
			}
		case NemPostgres:
			s.Param = pick([]string{"stop", "restart"})
			// Up to 45 s: well past the groups' rebalance grace (half the 10 s
			// rebalance timeout), so that a rebalance can drop a generation
			// whose worker is still waiting the outage out.
			if s.Param == "stop" {
				s.Hold = dur(3*time.Second, 45*time.Second)
			}
		case NemNet:
			s.Target, s.Param, s.Hold = pick([]string{"kafka", "postgres"}), pick(nemToxics), dur(2*time.Second, 45*time.Second)
			if s.Param == "latency" {
				s.N = 100 + rng.IntN(700)
			}
		case NemThirdParty:
			s.Param = pick(nemTPFaults)
			switch s.Param {
			// One setting at a time (each replaces the last), so short holds:
			// a step that comes while another holds the third party is skipped.
			case "slow": // ms per call, under the shim's 700ms timeout
				s.N, s.Hold = 300+rng.IntN(350), dur(6*time.Second, 20*time.Second)
			case "fail": // the next N settlements
				s.N, s.Hold = 5+rng.IntN(40), dur(3*time.Second, 10*time.Second)
			case "hang": // booked, answered after 2s, past the 700ms timeout
				s.N, s.Hold = 1+rng.IntN(4), dur(4*time.Second, 10*time.Second)
			case "reject": // the next N answered 422, not booked: dead-lettered by the shim
				s.N, s.Hold = 1+rng.IntN(5), dur(3*time.Second, 10*time.Second)
			}
		case NemSlot:
			s.Target = pick([]string{"orders", "billing"})
		case NemOperator:
			s.Param = pick(nemOperator)
		case NemLimit:
			s.Hold = dur(3*time.Second, 15*time.Second)
		case NemPGFailover:
			schedulePGFailover(&s, dur)
		case NemLeaderKill, NemBrokerPause, NemMinority, NemMajority:
			scheduleCluster(&s, dur, rng.IntN)
		case NemFailover:
			// Hold: the migration's first lock. N: the ms connections are
			// refused, few: a worker abandons about one message per 40 ms of
			// it (a failed begin, a 25–50 ms backoff), and what it does with
			// the rest of its batch once it can go on is what is tested.
			s.Target = "billing"
			s.Hold, s.N = dur(8*time.Second, 15*time.Second), 20+rng.IntN(100)
		default:
			planOptIn(&s, dur, pick) // nemesis_outbox.go
		}
		out = append(out, s)
	}
	return out
}

// history is the nemesis's record of a run; safe for concurrent use.
type history struct {
	mu   sync.Mutex
	recs []check.Record
}

func (h *history) add(r check.Record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
}

func (h *history) all() []check.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.recs)
}

// nemesisRun is one run's live state.
type nemesisRun struct {
	h    *Harness
	p    *Platform
	hist *history
	// busy marks the targets a running fault holds (an instance, "kafka",
	// "postgres", "thirdparty", a proxy): a step whose target is busy is
	// skipped, so that two faults never fight over one process.
	mu   sync.Mutex
	busy map[string]bool
	// stackMu serializes the server faults with each other: stack.sh
	// starts and stops both servers' scripts.
	stackMu sync.Mutex
	wg      sync.WaitGroup
	// procMu guards the platform's instance lists, which a join grows
	// while other steps look targets up.
	procMu sync.RWMutex
	// limited: the orders topic's max.message.bytes was lowered and is not
	// confirmed back on its default yet (nemesis_limit.go).
	limited atomic.Bool
	// reconcileBin is tools/cmd/reconcile, built for the run.
	reconcileBin string
	// pgKilled: when each pgfailover step's primary died, by step.At
	// (nemesis_pgfailover.go).
	pgKilled sync.Map
	// probeTopic times the cluster faults' recovery (nemesis_cluster.go).
	probeTopic string
}

// take marks targets busy, all of them or none.
func (n *nemesisRun) take(targets ...string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, t := range targets {
		if n.busy[t] {
			return false
		}
	}
	for _, t := range targets {
		n.busy[t] = true
	}
	return true
}

func (n *nemesisRun) release(targets ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, t := range targets {
		delete(n.busy, t)
	}
}

// proc finds a running instance by name.
func (n *nemesisRun) proc(name string) *Proc {
	n.procMu.RLock()
	defer n.procMu.RUnlock()
	for _, pr := range append(append(append([]*Proc{n.p.API}, n.p.Orders...), n.p.Billings...), n.p.Shims...) {
		if pr.Name == name {
			return pr
		}
	}
	return nil
}

// hold waits d or until ctx ends.
func hold(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d): // the fault lasts this long, under load
	}
}

// apply runs one step in the background; its record goes to the history
// when the fault is cleared.
func (n *nemesisRun) apply(ctx context.Context, s step) {
	busyKey := s.Target
	switch s.Kind {
	case NemKafka, NemPostgres, NemThirdParty, NemSlot, NemLimit:
		busyKey = s.Kind + "/" + s.Target
	case NemNet:
		busyKey = "net/" + s.Target
	case NemOperator:
		busyKey = "operator"
	case NemMember:
		if s.Param == "join" {
			busyKey = "join/" + s.Target
		}
	}
	keys := []string{busyKey}
	if s.Kind == NemPGFailover {
		keys = []string{NemPGFailover, NemPostgres + "/"} // the servers: no restart of them meanwhile
	}
	if s.Kind == NemFailover {
		keys = []string{NemFailover, "join/" + KindBilling} // billing's database, and a billing instance joining
	}
	if slices.Contains(NemClusterKinds, s.Kind) {
		keys = clusterKeys()
	}
	if s.Kind == NemWALStart {
		keys = n.walStartKeys() // nemesis_walstart.go
	}
	if !n.take(keys...) {
		n.h.logf("    skip %s: its target is held by another fault", s)
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer n.release(keys...)
		rec := check.Record{Kind: check.KindFault, Fault: s.Kind, Target: s.Target, At: time.Now(), Detail: s.Param}
		if s.Kind == NemPGFailover {
			rec.Mode = n.pgFailoverMode() // what check/failover.go allows it to take back
		}
		detail, err := n.run(ctx, s)
		if detail != "" {
			rec.Detail = detail
		}
		if err != nil {
			rec.Detail += " (error: " + err.Error() + ")"
			n.h.logf("    %s: %v", s, err)
		}
		if s.Hold > 0 || s.Kind == NemKafka || s.Kind == NemPostgres {
			rec.Until = time.Now()
		}
		if from, secs, ok := n.pgWindow(s); ok && s.Kind == NemPGFailover {
			rec.At, rec.Seconds = from, secs
		}
		n.hist.add(rec)
	}()
}

// run performs step s and clears it; it returns what it did.
func (n *nemesisRun) run(ctx context.Context, s step) (string, error) {
	p, stack := n.p, n.h.stack
	switch s.Kind {
	case NemPause:
		pr := n.proc(s.Target)
		if pr == nil || !pr.Running() {
			return "skipped: not running", nil
		}
		pid := pr.hp.Pid()
		if pid <= 0 {
			return "skipped: no process", nil
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return "", err
		}
		hold(ctx, s.Hold)
		// The process may have been SIGKILLed meanwhile (a kill step); a
		// pid that is gone is fine.
		_ = syscall.Kill(pid, syscall.SIGCONT)
		return fmt.Sprintf("SIGSTOP pid %d for %.1fs, then SIGCONT", pid, s.Hold.Seconds()), nil
	case NemKill:
		pr := n.proc(s.Target)
		if pr == nil || !pr.Running() {
			return "skipped: not running", nil
		}
		pr.Kill()
		return "SIGKILL", nil
	case NemMember:
		if s.Param == "leave" {
			pr := n.proc(s.Target)
			if pr == nil || !pr.Running() {
				return "skipped: not running", nil
			}
			pr.Stop()
			hold(ctx, s.Hold)
			return fmt.Sprintf("left (SIGTERM) for %.1fs, then started again", s.Hold.Seconds()), startPatiently(ctx, pr, false)
		}
		n.procMu.Lock()
		pr, err := p.newInstance[s.Target]()
		n.procMu.Unlock()
		if err != nil {
			return "join failed", err
		}
		if err := startPatiently(ctx, pr, true); err != nil {
			return "join failed", err
		}
		hold(ctx, s.Hold)
		pr.Stop()
		return fmt.Sprintf("%s joined for %.1fs, then left (SIGTERM)", pr.Name, s.Hold.Seconds()), nil
	case NemKafka, NemPostgres:
		n.stackMu.Lock()
		defer n.stackMu.Unlock()
		cctx := context.WithoutCancel(ctx)
		if s.Param == "restart" {
			if s.Kind == NemKafka {
				return "restarted", stack.RestartKafka(cctx)
			}
			return "restarted", stack.RestartPostgres(cctx)
		}
		var err error
		if s.Kind == NemKafka {
			err = stack.StopKafka(cctx)
		} else {
			err = stack.StopPostgres(cctx)
		}
		hold(ctx, s.Hold)
		if serr := stack.StartServers(cctx); serr != nil {
			return "start failed", serr
		}
		return fmt.Sprintf("stopped for %.1fs, then started", s.Hold.Seconds()), err
	case NemNet:
		px, err := stack.Toxi.Proxy(s.Target)
		if err != nil {
			return "", err
		}
		kind, attrs := s.Param, toxiproxy.Attributes{}
		switch s.Param {
		case "latency":
			attrs["latency"], attrs["jitter"] = s.N, s.N/4
		case "timeout": // data stops, the connection closes after 2s
			attrs["timeout"] = 2000
		case "reset_peer":
			attrs["timeout"] = 0
		case "cut": // nothing passes until removed: a cut of Hold
			kind, attrs["timeout"] = "timeout", 0
		}
		var names []string
		for _, stream := range []string{"upstream", "downstream"} {
			name := fmt.Sprintf("nem_%s_%s", s.Param, stream)
			if _, err := px.AddToxic(name, kind, stream, 1, attrs); err != nil {
				return "", err
			}
			names = append(names, name)
		}
		hold(ctx, s.Hold)
		for _, name := range names {
			_ = px.RemoveToxic(name)
		}
		return fmt.Sprintf("%s on the %s proxy for %.1fs", describeToxic(s), s.Target, s.Hold.Seconds()), nil
	case NemThirdParty:
		var body string
		switch s.Param {
		case "slow":
			body = fmt.Sprintf(`{"slowNext":10000,"slowFor":"%dms"}`, s.N)
		case "fail":
			body = fmt.Sprintf(`{"failNext":%d}`, s.N)
		case "hang":
			body = fmt.Sprintf(`{"hangNext":%d,"hangFor":"2s"}`, s.N)
		case "reject":
			body = fmt.Sprintf(`{"rejectNext":%d}`, s.N)
		}
		if err := postJSON(ctx, p.Recon.AdminURL()+"/admin/faults", []byte(body), nil); err != nil {
			return "", err
		}
		hold(ctx, s.Hold)
		err := postJSON(context.WithoutCancel(ctx), p.Recon.AdminURL()+"/admin/faults", []byte(`{}`), nil)
		return fmt.Sprintf("%s for %.1fs", body, s.Hold.Seconds()), err
	case NemSlot:
		return n.dropSlot(ctx, s.Target)
	case NemOperator:
		return n.operator(ctx, s.Param)
	case NemLimit:
		return n.limit(ctx, s.Hold)
	case NemFailover:
		return n.failover(ctx, s)
	case NemPGFailover:
		return n.pgFailover(ctx, s)
	case NemLeaderKill, NemBrokerPause, NemMinority, NemMajority:
		return n.cluster(ctx, s)
	}
	if detail, ok, err := n.runOptIn(ctx, s); ok { // nemesis_outbox.go
		return detail, err
	}
	return "", fmt.Errorf("no fault kind %q", s.Kind)
}

// startPatiently starts pr (first: its first start) as an orchestrator
// does: a start that fails because a server is down (another fault) is
// tried again, for up to 2 minutes.
func startPatiently(ctx context.Context, pr *Proc, first bool) error {
	cctx := context.WithoutCancel(ctx)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var err error
		if first {
			if err = pr.Start(cctx); err == nil {
				err = pr.WaitReady(cctx, 90*time.Second)
			}
		} else {
			err = pr.Resume(cctx, nil)
		}
		if err == nil {
			return nil
		}
		if pr.Running() {
			// Started, not ready in time: the supervisor keeps it going.
			return err
		}
		if time.Now().After(deadline) {
			return err
		}
		hold(cctx, time.Second)
	}
}

func describeToxic(s step) string {
	switch s.Param {
	case "latency":
		return fmt.Sprintf("latency %dms", s.N)
	case "timeout":
		return "connections stall and close after 2s"
	case "reset_peer":
		return "connections reset"
	}
	return "a cut (nothing passes)"
}

// dropSlot drops the replication slot of service's database: the walsender
// is ended first (an active slot cannot be dropped), and the relay, which
// reconnects at once, may win the race; a few tries.
func (n *nemesisRun) dropSlot(ctx context.Context, service string) (string, error) {
	db := n.p.OrdersDB
	if service == "billing" {
		db = n.p.BillingDB
	}
	admin := n.h.stack.Admin
	for try := range 20 {
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, db)
		tag, err := admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, db)
		if err == nil && tag.RowsAffected() > 0 {
			return fmt.Sprintf("slot %s dropped (try %d)", db, try+1), nil
		}
		hold(ctx, 100*time.Millisecond)
	}
	return "slot not dropped (always active)", nil
}

// operator performs an operator action mid-run, as the runbook describes
// it, and records its answer.
func (n *nemesisRun) operator(ctx context.Context, action string) (string, error) {
	p := n.p
	switch action {
	case "dlq-requeue-all", "outbox-requeue":
		detail, _, err := n.resolve(ctx, action)
		return detail, err
	case "replay":
		// The last 30 s of orders' events, republished under their ids.
		to := time.Now()
		body := fmt.Sprintf(`{"aggregateType":"order","from":%q,"to":%q,"dryRun":false}`,
			to.Add(-30*time.Second).UTC().Format(time.RFC3339Nano), to.UTC().Format(time.RFC3339Nano))
		var out struct {
			Events []any `json:"events"`
		}
		err := postJSON(ctx, p.API.AdminURL()+"/admin/outbox/replay", []byte(body), &out)
		return fmt.Sprintf("replay dryRun:false of the last 30s: %d events", len(out.Events)), err
	case "reconcile":
		return n.reconcileMidRun(ctx)
	}
	return "", fmt.Errorf("no operator action %q", action)
}

// resolve takes the runbook's end-of-run step and says how many it requeued.
func (n *nemesisRun) resolve(ctx context.Context, action string) (string, int, error) {
	p := n.p
	switch action {
	case "dlq-requeue-all":
		a, err := requeueDeadLetters(ctx, p.Billing, p.OrdersTopic)
		b, err2 := requeueDeadLetters(ctx, p.Shim, p.BillingTop)
		if err == nil {
			err = err2
		}
		return fmt.Sprintf("dead-letter requeue-all: billing %d, shim %d", a, b), a + b, err
	case "outbox-requeue":
		if p.relayMode() == "wal" {
			return n.requeueOutboxWAL(ctx)
		}
		a, err := requeueOutbox(ctx, p.API)
		b, err2 := requeueOutbox(ctx, p.Billing)
		if err == nil {
			err = err2
		}
		return fmt.Sprintf("outbox requeue: orders %d, billing %d", a, b), a + b, err
	}
	return "", 0, fmt.Errorf("no resolution %q", action)
}

// requeueOutboxWAL takes the outbox requeue in WAL-only mode, where the
// relay keeps no dead rows: the endpoint refuses with 409, as documented,
// and that answer is the expected one, not a failure.
func (n *nemesisRun) requeueOutboxWAL(ctx context.Context) (string, int, error) {
	var (
		answers []string
		total   int
	)
	for _, pr := range []*Proc{n.p.API, n.p.Billing} {
		k, err := requeueOutbox(ctx, pr)
		var se *statusError
		switch {
		case err == nil:
			answers, total = append(answers, fmt.Sprintf("%s %d", pr.Name, k)), total+k
		case errors.As(err, &se) && se.code == http.StatusConflict:
			answers = append(answers, pr.Name+" 409 as documented (WAL-only mode keeps no dead rows)")
		default:
			return "outbox requeue: " + strings.Join(answers, ", "), total, err
		}
	}
	return "outbox requeue: " + strings.Join(answers, ", "), total, nil
}

// requeueDeadLetters sends every pending dead letter of topic's consumer
// back (POST /admin/inbox/dead-letters/requeue), page by page.
func requeueDeadLetters(ctx context.Context, pr *Proc, topic string) (int, error) {
	total, after := 0, ""
	for range 100 {
		body := fmt.Sprintf(`{"topic":%q,"all":true,"after":%q}`, topic, after)
		var out struct {
			Requeued int    `json:"requeued"`
			Next     string `json:"next"`
		}
		if err := postJSON(ctx, pr.AdminURL()+"/admin/inbox/dead-letters/requeue", []byte(body), &out); err != nil {
			return total, err
		}
		total += out.Requeued
		if out.Next == "" {
			break
		}
		after = out.Next
	}
	return total, nil
}

// requeueOutbox sets every dead outbox row of pr's database back to pending.
func requeueOutbox(ctx context.Context, pr *Proc) (int, error) {
	total := 0
	for range 100 {
		var out struct {
			Requeued int `json:"requeued"`
		}
		if err := postJSON(ctx, pr.AdminURL()+"/admin/outbox/requeue", []byte(`{"all":true}`), &out); err != nil {
			return total, err
		}
		total += out.Requeued
		if out.Requeued < 1000 {
			break
		}
	}
	return total, nil
}

// clearAll ends every fault still on: toxics, the third party's setting,
// the servers, paused and stopped instances. It runs after the schedule's
// steps returned, so only what a step failed to clear is left.
func (n *nemesisRun) clearAll(ctx context.Context) {
	for _, name := range []string{"kafka", "postgres"} {
		if px, err := n.h.stack.Toxi.Proxy(name); err == nil {
			for _, t := range nemToxics {
				for _, stream := range []string{"upstream", "downstream"} {
					_ = px.RemoveToxic(fmt.Sprintf("nem_%s_%s", t, stream))
				}
			}
		}
	}
	_ = postJSON(ctx, n.p.Recon.AdminURL()+"/admin/faults", []byte(`{}`), nil)
	_ = n.h.stack.StartServers(ctx)
	if err := n.allowBillingConnections(ctx); err != nil {
		n.h.logf("    %v", err)
	}
	if n.limited.Load() {
		if _, err := n.restoreLimit(ctx); err != nil {
			n.h.logf("    %v", err)
		}
	}
	n.procMu.RLock()
	defer n.procMu.RUnlock()
	for _, pr := range n.p.all {
		if pid := pr.hp.Pid(); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
}
