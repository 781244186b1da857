package prove

import (
	"context"
	"fmt"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fault is one chaos step: inject, hold for a while under load, clear.
type fault struct {
	name   string
	inject func(ctx context.Context) error
	hold   time.Duration
	clear  func(ctx context.Context) error
}

// recoveries are what a proof says of the faults it injected one after
// the other: each fault with how long a probe order placed after it took to
// be booked by the third party (Harness.probe), and the worst of those.
type recoveries struct {
	notes []string
	worst float64
}

// recovered logs and notes that the probe order placed after fault was
// booked took later.
func (r *recoveries) recovered(h *Harness, fault string, took time.Duration) {
	h.logf("    recovered: a probe order placed after the fault was booked by the third party %.1fs later", took.Seconds())
	r.notes = append(r.notes, fmt.Sprintf("%s (recovered in %.1fs)", fault, took.Seconds()))
	r.worst = max(r.worst, took.Seconds())
}

// apply injects f, lets it last its hold (under the proof's load) and
// clears it.
func (h *Harness) apply(ctx context.Context, f fault) error {
	h.logf("  fault: %s", f.name)
	if err := f.inject(ctx); err != nil {
		return fmt.Errorf("injecting %q: %w", f.name, err)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(f.hold):
	}
	if err := f.clear(ctx); err != nil {
		return fmt.Errorf("clearing %q: %w", f.name, err)
	}
	return nil
}

// chaos: under steady load, Kafka and Postgres are restarted, the network
// between the services and them turns slow, resets connections and stalls,
// the third party answers 500s and hangs, and the shim is killed after its
// call to the third party. After each fault a probe order is placed and
// timed until the third party booked it: the recovery time. At the end
// nothing may be lost and nothing settled twice.
func (h *Harness) chaos(ctx context.Context, _ bool) Row {
	var row Row
	p, err := h.newPlatform(ctx, "chaos", Setup{ReconcilerTimeout: "2s", ShimArm: arm(crashAfterEffect, h.prof.ShimCrashes, 3)})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	s := h.stack
	toxic := func(proxy, name, kind string, attrs toxiproxy.Attributes) func(ctx context.Context) error {
		return func(context.Context) error {
			px, err := s.Toxi.Proxy(proxy)
			if err != nil {
				return err
			}
			for _, stream := range []string{"downstream", "upstream"} {
				if _, err := px.AddToxic(name+"_"+stream, kind, stream, 1, attrs); err != nil {
					return err
				}
			}
			return nil
		}
	}
	untoxic := func(proxy, name string) func(ctx context.Context) error {
		return func(context.Context) error {
			px, err := s.Toxi.Proxy(proxy)
			if err != nil {
				return err
			}
			for _, stream := range []string{"downstream", "upstream"} {
				if err := px.RemoveToxic(name + "_" + stream); err != nil {
					return err
				}
			}
			return nil
		}
	}
	thirdParty := func(body string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			return postJSON(ctx, p.Recon.AdminURL()+"/admin/faults", []byte(body), nil)
		}
	}
	nothing := func(context.Context) error { return nil }
	faults := []fault{
		{"Kafka latency 300ms ±100ms", toxic("kafka", "slow", "latency", toxiproxy.Attributes{"latency": 300, "jitter": 100}),
			6 * time.Second, untoxic("kafka", "slow")},
		{"Postgres connections reset", toxic("postgres", "reset", "reset_peer", toxiproxy.Attributes{"timeout": 0}),
			3 * time.Second, untoxic("postgres", "reset")},
		{"Kafka stalls, connections time out after 3s", toxic("kafka", "stall", "timeout", toxiproxy.Attributes{"timeout": 3000}),
			6 * time.Second, untoxic("kafka", "stall")},
		{"Postgres latency 200ms", toxic("postgres", "slow", "latency", toxiproxy.Attributes{"latency": 200}),
			5 * time.Second, untoxic("postgres", "slow")},
		{"Kafka restarted", s.RestartKafka, 0, nothing},
		{"Postgres restarted", s.RestartPostgres, 0, nothing},
		{"third party answers 500 to the next 4 settlements", thirdParty(`{"failNext":4}`), 3 * time.Second, thirdParty(`{}`)},
		{"third party books then hangs 5s on the next 3 settlements (the shim gives up after 2s)",
			thirdParty(`{"hangNext":3,"hangFor":"5s"}`), 8 * time.Second, thirdParty(`{}`)},
	}

	d := newDriver(p.API.URL(), p.Name)
	lctx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan struct{})
	go func() { d.Drive(lctx, 3, 10, 0, 1<<30, nil); close(loadDone) }()
	defer func() { stopLoad(); <-loadDone }()

	var rec recoveries
	for _, f := range faults {
		if err := h.apply(ctx, f); err != nil {
			return fail(row, err)
		}
		took, err := h.probe(ctx, p, d)
		if err != nil {
			return fail(row, fmt.Errorf("after %q: %w", f.name, err))
		}
		rec.recovered(h, f.name, took)
	}
	// The shim's crash points fire as its budget allows; keep the load on
	// until they did.
	if err := waitUntil(ctx, 3*time.Minute, func() bool { return p.Shim.Crashes() >= h.prof.ShimCrashes }); err != nil {
		row.Error = fmt.Sprintf("the shim crashed %d of %d times", p.Shim.Crashes(), h.prof.ShimCrashes)
	}
	stopLoad()
	<-loadDone
	// Outbox rows that exhausted their attempts while a server was down are
	// dead: parked, counted, never retried silently. Requeueing them is the
	// operator's step of the runbook; the proof takes it and reports it.
	if _, err := p.waitQuiet(ctx, h.prof.Stable); err != nil {
		return fail(row, err)
	}
	requeued := 0
	for _, svc := range []struct {
		proc          *Proc
		db            func() int
		aggregateType string
	}{
		{p.API, func() int { return countDead(ctx, p.ordersPool) }, "order"},
		{p.Billing, func() int { return countDead(ctx, p.billingPool) }, "payment"},
	} {
		if svc.db() == 0 {
			continue
		}
		var out struct {
			Requeued int `json:"requeued"`
		}
		// At most 1000 rows per call (outboxhttp.MaxRequeue): call again
		// while a call fills its limit.
		body := []byte(`{"aggregateType":"` + svc.aggregateType + `"}`)
		for {
			out.Requeued = 0
			if err := postJSON(ctx, svc.proc.AdminURL()+"/admin/outbox/requeue", body, &out); err != nil {
				return fail(row, fmt.Errorf("requeueing dead outbox events: %w", err))
			}
			requeued += out.Requeued
			if out.Requeued < 1000 {
				break
			}
		}
	}
	if requeued > 0 {
		h.logf("  %d outbox events went dead during the outages (10 attempts spent); requeued them through POST /admin/outbox/requeue", requeued)
	}
	a, _, err := h.settleAndAudit(ctx, p, d)
	if err != nil {
		return fail(row, err)
	}
	row.Faults = len(faults) + p.Shim.Crashes()
	row.FaultsDesc = strings.Join(rec.notes, "; ") + fmt.Sprintf("; %d SIGKILLs of the shim at %s", p.Shim.Crashes(), crashAfterEffect)
	row.Absorbed = p.absorbed()
	row.RecoverySeconds = rec.worst
	for _, n := range rec.notes {
		row.check(true, "injected: %s", n)
	}
	row.check(true, "outbox events that went dead during the outages and an operator requeued (POST /admin/outbox/requeue): %d", requeued)
	row.check(p.Shim.Crashes() >= h.prof.ShimCrashes, "the shim was killed after its third-party call at least %d times (%d)", h.prof.ShimCrashes, p.Shim.Crashes())
	endToEnd(&row, a)
	return row
}

// countDead is the number of dead outbox rows (-1 if it cannot tell).
func countDead(ctx context.Context, pool *pgxpool.Pool) int {
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE state = 'dead'`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// probe places one order and waits until the third party booked it.
func (h *Harness) probe(ctx context.Context, p *Platform, d *Driver) (time.Duration, error) {
	start := time.Now()
	id, ok := d.PlaceOne(ctx, d.next.Add(1))
	if !ok {
		return 0, fmt.Errorf("the probe order was never accepted")
	}
	err := waitUntil(ctx, 3*time.Minute, func() bool { return p.booked(ctx, id) })
	if err != nil {
		return 0, fmt.Errorf("the probe order %s was not booked by the third party within 3 minutes", id)
	}
	return time.Since(start), nil
}

// booked reports whether the ledger holds a capture of order id.
func (p *Platform) booked(ctx context.Context, id uuid.UUID) bool {
	ledger, err := p.ledger(ctx)
	if err != nil {
		return false
	}
	for _, s := range ledger {
		if s.OrderID == id.String() && s.Kind == "capture" {
			return true
		}
	}
	return false
}
