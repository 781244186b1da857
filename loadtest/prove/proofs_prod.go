package prove

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
)

// The production-shaped proofs (issue 11): several instances of every
// service, outages of minutes, a relay that is busy but behind. Besides the
// audit every load proof makes, each one fails on a process that exited by
// itself: a service rides out what happens around it in the process.

// settleTimeout bounds the wait for both consumer groups to commit every
// partition to its end after the load: a SIGKILLed member holds its
// partitions until its session times out (10s) and the group rebalances,
// so a quiet spell of a few seconds is not yet the end.
const settleTimeout = 2 * time.Minute

// pgLatencyMS is the PostgreSQL latency scale-out adds (downstream).
const pgLatencyMS = 20

// prodChecks adds the checks every production-shaped proof makes: the
// end-to-end audit, the per-aggregate order of placed-then-cancelled
// orders at billing and at the third party, refunds once, no exits.
func prodChecks(row *Row, p *Platform, a Audit, d *Driver) {
	endToEnd(row, a)
	row.Lost += a.RefundsWithoutSettlement
	row.Duplicated += a.DuplicateRefunds
	row.OutOfOrder = a.OutOfOrder()
	row.check(d.CancelEvery == 0 || a.Cancelled > 0, "orders were cancelled right after being placed, so aggregates had two events in flight (%d cancelled, %d acknowledged)", a.Cancelled, d.Cancelled())
	row.check(a.CancelledNotRefunded == 0, "billing refunded every cancelled order's charge, so it handled OrderCancelled after OrderPlaced (%d not refunded)", a.CancelledNotRefunded)
	row.check(a.BillingOutOfOrder == 0, "billing wrote no PaymentRefunded before its PaymentCaptured (%d)", a.BillingOutOfOrder)
	row.check(a.LedgerOutOfOrder == 0, "the third party booked no refund before its capture (%d)", a.LedgerOutOfOrder)
	row.check(a.RefundsWithoutSettlement == 0, "every refund was booked by the third party (%d not)", a.RefundsWithoutSettlement)
	row.check(a.DuplicateRefunds == 0, "no order was refunded twice (%d extra)", a.DuplicateRefunds)
	exits, detail := p.Exits()
	row.check(exits == 0, "0 process exits: no service ended by itself (%d%s)", exits, listSuffix(detail))
	row.check(p.Hangs() == 0, "every SIGTERM the harness sent ended its process within 20s (%d did not)", p.Hangs())
}

func listSuffix(items []string) string {
	if len(items) == 0 {
		return ""
	}
	return ": " + strings.Join(items, "; ")
}

// offsetsAtEnd waits until billing's group on the orders topic and the
// shim's group on the billing topic committed every partition up to its end
// offset, and checks it on row, listing the partitions still behind.
func (p *Platform) offsetsAtEnd(ctx context.Context, row *Row) {
	type group struct{ name, topic string }
	groups := []group{{p.Billing.env("CONSUMER_GROUP"), p.OrdersTopic}, {p.ShimGroup, p.BillingTop}}
	behind := map[string]map[int]int64{}
	var lastErr error
	at := func() bool {
		done := true
		lastErr = nil
		for _, g := range groups {
			b, err := groupBehind(ctx, p.h.stack.Brokers(), g.name, g.topic)
			if err != nil {
				lastErr, done = err, false
				continue
			}
			behind[g.name] = b
			for _, n := range b {
				if n != 0 {
					done = false
				}
			}
		}
		return done
	}
	began := time.Now()
	p.h.logf("  waiting (up to %s) until both consumer groups committed every partition to its end offset …", settleTimeout)
	_ = waitUntil(ctx, settleTimeout, at)
	waited := time.Since(began).Seconds()
	for _, g := range groups {
		var parts []string
		for _, part := range slices.Sorted(maps.Keys(behind[g.name])) {
			if n := behind[g.name][part]; n != 0 {
				parts = append(parts, fmt.Sprintf("%d behind by %d", part, n))
			}
		}
		// Judged on this group's last reading: the wait covers both groups.
		row.check(len(parts) == 0 && behind[g.name] != nil,
			"consumer group %q committed every partition of its topic to the end offset (OffsetFetch = ListOffsets; %d partitions; still behind: %s; last error %v; waited %.1fs)",
			g.name, len(behind[g.name]), orNone(parts), lastErr, waited)
	}
}

func orNone(items []string) string {
	if len(items) == 0 {
		return "none"
	}
	return strings.Join(items, ", ")
}

// loadOn starts the driver in the background at rate orders/s with workers
// and returns a func that stops it and waits.
func loadOn(ctx context.Context, d *Driver, workers, rate int) (stop func()) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { d.Drive(lctx, workers, rate, 0, 1<<30, nil); close(done) }()
	return func() { cancel(); <-done }
}

// scaleOut: 3 orders relays, 3 billing instances and 2 shims under steady
// load, while instances are SIGKILLed (the supervisor restarts them),
// stopped gracefully, started again, added and retired: every change moves
// relay partition ownership or rebalances a consumer group.
func (h *Harness) scaleOut(ctx context.Context, _ bool) Row {
	var row Row
	prof := h.prof.Scale
	p, err := h.newPlatform(ctx, "scale-out", Setup{Relays: 3, APIOnly: true, Billings: 3, Shims: 2})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	d := newDriver(p.API.URL(), p.Name)
	d.CancelEvery = 4
	stopLoad := loadOn(ctx, d, 3, prof.Rate)
	defer stopLoad()

	instances := map[string]*[]*Proc{KindRelay: &p.Orders, KindBilling: &p.Billings, KindShim: &p.Shims}
	// At most this many instances of a kind run; an "add" beyond it
	// retires the newest instead (a scale-in), so the full profile's churn
	// does not pile processes onto a small machine.
	limit := map[string]int{KindRelay: 4, KindBilling: 4, KindShim: 3}
	running := func(kind string) []*Proc {
		var out []*Proc
		for _, pr := range *instances[kind] {
			if pr.Running() {
				out = append(out, pr)
			}
		}
		return out
	}
	var stopped []*Proc
	kill := func(kind string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) {
			r := running(kind)
			pr := r[rand.IntN(len(r))]
			pr.Kill()
			return "SIGKILL " + pr.Name, nil
		}
	}
	stop := func(kind string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) {
			r := running(kind)
			if len(r) < 2 {
				pr := r[0]
				pr.Kill()
				return "SIGKILL " + pr.Name + " (the last one running: not stopped)", nil
			}
			pr := r[rand.IntN(len(r))]
			pr.Stop()
			stopped = append(stopped, pr)
			return "SIGTERM " + pr.Name + " (stays down)", nil
		}
	}
	resume := func(ctx context.Context) (string, error) {
		if len(stopped) == 0 {
			return kill(KindBilling)(ctx)
		}
		pr := stopped[0]
		stopped = stopped[1:]
		return "start " + pr.Name + " again", pr.Resume(ctx, nil)
	}
	add := func(kind string) func(context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			if r := running(kind); len(r) >= limit[kind] {
				pr := r[len(r)-1]
				pr.Stop()
				return "retire " + pr.Name + " (scale in)", nil
			}
			pr, err := p.Add(ctx, kind)
			if pr == nil {
				return "add a " + kind + " instance", err
			}
			return "add " + pr.Name, err
		}
	}
	actions := []func(context.Context) (string, error){
		kill(KindBilling), kill(KindRelay), add(KindBilling), kill(KindShim), stop(KindBilling), add(KindRelay),
		resume, add(KindShim), kill(KindRelay), stop(KindShim), kill(KindBilling), resume,
	}
	if err := waitUntil(ctx, 30*time.Second, func() bool { n, _, _ := d.Stats(); return n >= 20 }); err != nil {
		return fail(row, fmt.Errorf("the load did not start: %w", err))
	}
	// A little database latency keeps messages in flight in every consumer
	// when its group rebalances, which is where offset tracking breaks; an
	// idle consumer has nothing to get wrong.
	pgpx, err := h.stack.Toxi.Proxy("postgres")
	if err != nil {
		return fail(row, err)
	}
	if _, err := pgpx.AddToxic("scale_latency", "latency", "downstream", 1, toxiproxy.Attributes{"latency": pgLatencyMS}); err != nil {
		return fail(row, fmt.Errorf("adding PostgreSQL latency: %w", err))
	}
	defer func() { _ = pgpx.RemoveToxic("scale_latency") }()
	h.logf("  %d membership changes under %d orders/s, PostgreSQL latency %dms, one change every %s …", prof.Changes, prof.Rate, pgLatencyMS, prof.Every)
	var log []string
	var lastChange time.Time
	for i := range prof.Changes {
		select {
		case <-ctx.Done():
			return fail(row, ctx.Err())
		case <-time.After(prof.Every):
		}
		what, err := actions[i%len(actions)](ctx)
		lastChange = time.Now()
		if err != nil {
			return fail(row, fmt.Errorf("membership change %d (%s): %w", i+1, what, err))
		}
		h.logf("    change %d: %s", i+1, what)
		log = append(log, what)
	}
	// The stopped instances come back before the audit, as a rollout ends.
	for len(stopped) > 0 {
		what, err := resume(ctx)
		if err != nil {
			return fail(row, fmt.Errorf("%s: %w", what, err))
		}
		log = append(log, what)
	}
	stopLoad()
	_ = pgpx.RemoveToxic("scale_latency")
	a, quietAt, err := h.settleAndAudit(ctx, p, d)
	if err != nil {
		return fail(row, err)
	}
	p.offsetsAtEnd(ctx, &row)
	row.Faults = len(log)
	row.FaultsDesc = fmt.Sprintf("%d membership changes under %d orders/s (every 4th order cancelled at once, PostgreSQL latency %dms): %s",
		len(log), prof.Rate, pgLatencyMS, strings.Join(log, ", "))
	row.Absorbed = p.absorbed()
	row.RecoverySeconds = recoverySince(lastChange, quietAt)
	row.check(len(log) >= prof.Changes, "at least %d membership changes (%d)", prof.Changes, len(log))
	row.check(true, "instances at the end: %d orders relays, %d billing, %d shims; events each billing instance processed: %s",
		len(p.Orders), len(p.Billings), len(p.Shims), perInstance(p.Billings, "inbox_processed_total"))
	prodChecks(&row, p, a, d)
	return row
}

// perInstance lists counter name of each process, summed over its lifetimes.
func perInstance(procs []*Proc, name string) string {
	var out []string
	for _, pr := range procs {
		out = append(out, fmt.Sprintf("%s %.0f", pr.Name, pr.Counter(name)))
	}
	return strings.Join(out, ", ")
}

// kafkaOutage: under load, Kafka is stopped for minutes, then restarted
// again and again, then PostgreSQL is stopped. Nothing may go dead, no
// process may exit, and after each fault a probe order is timed until the
// third party booked it.
func (h *Harness) kafkaOutage(ctx context.Context, _ bool) Row {
	var row Row
	prof := h.prof.Outage
	p, err := h.newPlatform(ctx, "kafka-outage", Setup{})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	s := h.stack
	d := newDriver(p.API.URL(), p.Name)
	d.CancelEvery = 5
	stopLoad := loadOn(ctx, d, 2, prof.Rate)
	defer stopLoad()
	if err := waitUntil(ctx, 30*time.Second, func() bool { n, _, _ := d.Stats(); return n >= 10 }); err != nil {
		return fail(row, fmt.Errorf("the load did not start: %w", err))
	}
	hold := func(dur time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(dur): // the fault lasts this long, under load
			return nil
		}
	}
	restarts := func(ctx context.Context) error {
		for i := range prof.Restarts {
			if i > 0 {
				if err := hold(prof.RestartEvery); err != nil {
					return err
				}
			}
			h.logf("    Kafka restart %d of %d", i+1, prof.Restarts)
			if err := s.RestartKafka(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	faults := []fault{
		{fmt.Sprintf("Kafka stopped for %s", prof.Kafka), s.StopKafka, prof.Kafka, s.StartServers},
		{fmt.Sprintf("Kafka restarted %d times, %s apart", prof.Restarts, prof.RestartEvery), restarts, 0,
			func(context.Context) error { return nil }},
		{fmt.Sprintf("PostgreSQL stopped for %s", prof.Postgres), s.StopPostgres, prof.Postgres, s.StartServers},
	}
	var rec recoveries
	for _, f := range faults {
		if err := h.apply(ctx, f); err != nil {
			return fail(row, err)
		}
		took, err := h.probe(ctx, p, d)
		if err != nil {
			// Keep going: the later faults and the audit say more than a stop here.
			h.logf("    NOT recovered: %v", err)
			row.check(false, "after %s a probe order was booked by the third party (%v)", f.name, err)
			rec.notes = append(rec.notes, f.name+" (not recovered within 3 minutes)")
			continue
		}
		rec.recovered(h, f.name, took)
		row.check(true, "after %s a probe order was booked by the third party %.1fs later", f.name, took.Seconds())
	}
	stopLoad()
	a, _, err := h.settleAndAudit(ctx, p, d)
	if err != nil {
		return fail(row, err)
	}
	p.offsetsAtEnd(ctx, &row)
	deadOrders, deadBilling := countDead(ctx, p.ordersPool), countDead(ctx, p.billingPool)
	row.Faults = len(faults) - 1 + prof.Restarts
	row.FaultsDesc = strings.Join(rec.notes, "; ")
	row.Absorbed = p.absorbed()
	row.RecoverySeconds = rec.worst
	row.check(deadOrders == 0 && deadBilling == 0, "0 dead outbox rows: an outage is not an event's fault (orders %d, billing %d)", deadOrders, deadBilling)
	prodChecks(&row, p, a, d)
	return row
}

// busyRelay: Kafka is slowed through toxiproxy (latency, and bandwidth per
// connection) so that the orders relay publishes all the time yet falls
// behind the load. The backlog must show while it happens: the oldest
// pending age passes the alert threshold while outbox_published_total keeps
// rising. Then the toxics go and the backlog drains.
func (h *Harness) busyRelay(ctx context.Context, _ bool) Row {
	var row Row
	prof := h.prof.Busy
	p, err := h.newPlatform(ctx, "busy-relay", Setup{})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	relay := p.Orders[0] // also the API: the gauges are on its /metrics
	d := newDriver(p.API.URL(), p.Name)
	stopLoad := loadOn(ctx, d, 6, prof.Rate)
	defer stopLoad()
	// A sample holds the relay's gauges and counter as /metrics shows them,
	// and the truth from the database beside them: a gauge that freezes
	// while the relay is busy shows as a gap between the two.
	type sample struct {
		at                      time.Time
		pending, age, published float64
		dbPending               int
		dbAge                   float64
	}
	read := func() (sample, bool) {
		m, err := relay.Metrics()
		if err != nil {
			return sample{}, false
		}
		s := sample{at: time.Now(), pending: m["outbox_pending_events"], age: m["outbox_oldest_pending_age_seconds"],
			published: m["outbox_published_total"]}
		err = p.ordersPool.QueryRow(ctx, `SELECT count(*), COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)), 0)::float8
			FROM outbox_events WHERE state = 'pending'`).Scan(&s.dbPending, &s.dbAge)
		return s, err == nil
	}
	if err := waitUntil(ctx, 30*time.Second, func() bool { n, _, _ := d.Stats(); return n >= 2*prof.Rate }); err != nil {
		return fail(row, fmt.Errorf("the load did not start: %w", err))
	}
	px, err := h.stack.Toxi.Proxy("kafka")
	if err != nil {
		return fail(row, err)
	}
	toxics := []struct {
		name, kind, stream string
		attrs              toxiproxy.Attributes
	}{
		{"busy_latency_up", "latency", "upstream", toxiproxy.Attributes{"latency": 50, "jitter": 20}},
		{"busy_latency_down", "latency", "downstream", toxiproxy.Attributes{"latency": 50, "jitter": 20}},
		{"busy_bandwidth_up", "bandwidth", "upstream", toxiproxy.Attributes{"rate": prof.KBps}},
	}
	removeToxics := func() {
		for _, t := range toxics {
			_ = px.RemoveToxic(t.name)
		}
	}
	defer removeToxics()
	start, ok := read()
	if !ok {
		return fail(row, fmt.Errorf("cannot scrape %s", relay.MetricsURL()))
	}
	h.logf("  slowing Kafka (latency 50ms ±20ms each way, upstream %d KB/s per connection) under %d orders/s; pending %.0f, oldest %.1fs …",
		prof.KBps, prof.Rate, start.pending, start.age)
	for _, t := range toxics {
		if _, err := px.AddToxic(t.name, t.kind, t.stream, 1, t.attrs); err != nil {
			return fail(row, fmt.Errorf("adding toxic %s: %w", t.name, err))
		}
	}
	slowed := time.Now()
	var samples []sample
	var alert sample
	err = waitUntil(ctx, prof.Within, func() bool {
		s, ok := read()
		if !ok {
			return false
		}
		samples = append(samples, s)
		if s.age > prof.Age {
			alert = s
			return true
		}
		return false
	})
	last := start
	if len(samples) > 0 {
		last = samples[len(samples)-1]
	}
	if err != nil {
		h.logf("  the alert condition did not hold within %s: oldest pending age %.1fs, %.0f pending, %.0f published since the slowdown (the database: oldest %.1fs, %d pending)",
			prof.Within, last.age, last.pending, last.published-start.published, last.dbAge, last.dbPending)
	} else {
		h.logf("  alert condition (oldest pending %.1fs > %.0fs) after %.1fs; %.0f pending, %.0f published since the slowdown",
			alert.age, prof.Age, alert.at.Sub(slowed).Seconds(), alert.pending, alert.published-start.published)
	}
	// The relay kept claiming through the window: its published counter rose.
	// Whether it rose in each half is reported, not required: over a link
	// this slow a batch can take longer than half the window.
	end := last
	if !alert.at.IsZero() {
		end = alert
	}
	mid := start
	for _, s := range samples {
		if s.at.Sub(slowed) <= end.at.Sub(slowed)/2 {
			mid = s
		}
	}
	removeToxics()
	unslowed := time.Now()
	var drainedAt time.Time
	derr := waitUntil(ctx, 2*time.Minute, func() bool {
		s, ok := read()
		if ok && s.pending == 0 && s.age == 0 {
			drainedAt = time.Now()
			return true
		}
		return false
	})
	stopLoad()
	a, _, aerr := h.settleAndAudit(ctx, p, d)
	if aerr != nil {
		return fail(row, aerr)
	}
	ages := make([]float64, 0, len(samples))
	for _, s := range samples {
		ages = append(ages, s.age)
	}
	sort.Float64s(ages)
	row.Faults = 1
	row.FaultsDesc = fmt.Sprintf("Kafka slowed for %.0fs (latency 50ms ±20ms each way, %d KB/s upstream per connection) under %d orders/s",
		unslowed.Sub(slowed).Seconds(), prof.KBps, prof.Rate)
	row.RecoverySeconds = recoverySince(unslowed, drainedAt)
	row.Absorbed = p.absorbed()
	alertAfter := "never"
	if !alert.at.IsZero() {
		alertAfter = fmt.Sprintf("after %.1fs", alert.at.Sub(slowed).Seconds())
	}
	row.check(err == nil, "the alert condition outbox_oldest_pending_age_seconds > %.0f held within %s of the slowdown (%s; last age seen %.1fs, %.0f pending)",
		prof.Age, prof.Within, alertAfter, last.age, last.pending)
	row.check(end.dbAge > prof.Age/2, "the relay fell behind: the oldest pending row in the database was %.1fs old at the end of the window (%d pending; outbox_pending_events %.0f before, %.0f then)",
		end.dbAge, end.dbPending, start.pending, end.pending)
	row.check(end.published > start.published,
		"the relay kept publishing through the window: outbox_published_total rose by %.0f (%.0f in its first half, %.0f in its second)",
		end.published-start.published, mid.published-start.published, end.published-mid.published)
	row.check(derr == nil, "after the toxics were removed the backlog drained to zero (in %.1fs)", row.RecoverySeconds)
	prodChecks(&row, p, a, d)
	return row
}
