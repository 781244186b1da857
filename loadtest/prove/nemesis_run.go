package prove

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/loadtest/prove/check"
	"github.com/onceflow/onceflow/platform/pgroles"
)

// nemesisReader is the read-only role the read-back uses: what the
// checker sees, an operator's reconciliation could see too.
var nemesisReader = pgroles.Login{Name: "nemesis_ro", Password: "nemesis_ro"}

// sqlNemLivePending counts the pending outbox rows that a relay is still
// to publish: not those held back behind a dead row of their aggregate.
const sqlNemLivePending = `SELECT count(*) FROM outbox_events e WHERE e.state = 'pending' AND NOT EXISTS (
	SELECT 1 FROM outbox_events d WHERE d.state = 'dead' AND d.aggregate_type = e.aggregate_type
	AND d.aggregate_id = e.aggregate_id AND d.aggregate_version < e.aggregate_version)`

func heldPending(ctx context.Context, p *Platform) (orders, billing int, err error) {
	if err = p.ordersPool.QueryRow(ctx, sqlNemLivePending).Scan(&orders); err != nil {
		return 0, 0, err
	}
	err = p.billingPool.QueryRow(ctx, sqlNemLivePending).Scan(&billing)
	return orders, billing, err
}

// The read-back queries, one per component the history records.
const (
	sqlNemOrders = `SELECT o.id::text, o.status, coalesce(k.key, '') FROM orders o
		LEFT JOIN idempotency_keys k ON k.order_id = o.id`
	sqlNemOutbox = `SELECT event_id::text, event_type, aggregate_id, aggregate_version, state FROM outbox_events`
	sqlNemInbox  = `SELECT message_id::text, event_type, aggregate_id, aggregate_version, status FROM inbox_messages`
	sqlNemCharge = `SELECT order_id::text, status, version FROM charges`
	// A message parked behind a dead one of its aggregate has no inbox row.
	sqlNemParked = `SELECT message_id::text, event_type, aggregate_id, aggregate_version, 'parked' FROM inbox_parked_messages`
)

// nemesis runs the platform production-shaped under the seeded schedule,
// then resolves what the runbook resolves, reads everything back into the
// history and checks it.
func (h *Harness) nemesis(ctx context.Context, _ bool) Row {
	var row Row
	opts := h.opts.Nemesis
	seed := opts.Seed
	if seed == 0 {
		seed = time.Now().UnixNano() % 1_000_000
	}
	duration := opts.Duration
	if duration == 0 {
		duration = h.prof.NemesisDuration
	}
	relayMode := h.relayMode
	if relayMode == "" {
		relayMode = "poll"
	}
	kinds, err := chosenKinds(opts.Kinds, relayMode)
	if err != nil {
		return fail(row, err)
	}
	if kinds, err = withTopology(kinds, opts.Kinds, opts.Topology); err != nil {
		return fail(row, err)
	}
	if len(opts.Targets) > 0 {
		for _, t := range opts.Targets {
			if !slices.Contains([]string{KindRelay, KindBilling, KindShim}, strings.TrimSpace(t)) {
				return fail(row, fmt.Errorf("NEMESIS_TARGETS: no instance kind %q (orders, billing, shim)", t))
			}
		}
	}
	steps := schedule(seed, kinds, duration, opts.Targets)
	h.logf("  SEED=%d NEMESIS=%s NEMESIS_TARGETS=%s NEMESIS_DURATION=%s NEMESIS_TOPOLOGY=%s RELAY_MODE=%s: %d steps", seed, strings.Join(kinds, ","),
		strings.Join(opts.Targets, ","), duration, opts.Topology, relayMode, len(steps))
	for _, s := range steps {
		h.logf("    %s", s)
	}
	reconcileBin, err := h.buildReconcile(ctx)
	if err != nil {
		return fail(row, err)
	}
	shimEnv := func() map[string]string {
		return map[string]string{"CRASH_POINT": "none", "RECONCILER_MAX_IN_FLIGHT": nemMaxInFlight}
	}
	p, err := h.newPlatform(ctx, "nemesis", Setup{Relays: 2, APIOnly: true, Billings: 2, Shims: 2,
		ReconcilerTimeout: nemReconcilerTimeout, ShimArm: shimEnv})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	hist := &history{}
	hist.add(check.Record{Kind: check.KindRun, Seed: seed, Mode: relayMode, Bound: nemDrainBound.Seconds(),
		Detail: "NEMESIS=" + strings.Join(kinds, ",") + " NEMESIS_DURATION=" + duration.String() + topologyNote(opts.Topology)})
	n := &nemesisRun{h: h, p: p, hist: hist, busy: map[string]bool{}, reconcileBin: reconcileBin}
	if opts.Topology == TopologyHA {
		if err := n.ensureProbeTopic(ctx); err != nil {
			return fail(row, err)
		}
	}
	// However the run ends, no fault outlives it: the stack is shared with
	// the proofs that come after (a toxic left on a proxy, a server left
	// stopped, a process left frozen would fail them for nothing).
	defer func() { n.wg.Wait(); n.clearAll(context.WithoutCancel(ctx)) }()

	client := &nemClient{url: p.API.URL(), prefix: p.Name, hist: hist, http: http.Client{Timeout: 3 * time.Second}}
	lctx, stopLoad := context.WithCancel(ctx)
	var loadWG sync.WaitGroup
	loadWG.Add(1)
	go func() { defer loadWG.Done(); client.drive(lctx, nemRate) }()
	defer func() { stopLoad(); loadWG.Wait() }()

	began := time.Now()
	for _, s := range steps {
		select {
		case <-ctx.Done():
			return fail(row, ctx.Err())
		case <-time.After(time.Until(began.Add(s.At))):
		}
		h.logf("    %s", s)
		n.apply(ctx, s)
	}
	hold(ctx, time.Until(began.Add(duration)))
	h.logf("  schedule done; waiting for the faults still on to clear …")
	n.wg.Wait()
	stopLoad()
	loadWG.Wait()
	n.clearAll(ctx)
	faultsEnded := time.Now()

	// Liveness: with the faults gone, the lag and the backlogs must drain
	// within the bound (dead rows do not count: they wait for an operator).
	drained := -1.0
	var last progress
	_ = waitUntil(ctx, nemDrainBound+time.Minute, func() bool {
		g, err := p.progress(ctx)
		if err != nil {
			return false
		}
		last = g
		if p.relayMode() == "poll" {
			// A row held back behind a dead row of its aggregate waits for
			// the operator, as the dead one does: not in flight.
			g.pending, g.billingPending, err = heldPending(ctx, p)
			if err != nil {
				return false
			}
			g.dead, g.billingDead = 0, 0
			last = g
		}
		if !g.inFlight() {
			drained = time.Since(faultsEnded).Seconds()
			return true
		}
		return false
	})
	hist.add(check.Record{Kind: check.KindDrain, At: faultsEnded, Seconds: drained, Bound: nemDrainBound.Seconds(),
		Detail: fmt.Sprintf("last reading: %d orders pending (%d dead; poll: pending held behind a dead row not counted), %d billing pending (%d dead), lag %d",
			last.pending, last.dead, last.billingPending, last.billingDead, last.lag)})
	h.logf("  drained %.1fs after the faults stopped (bound %s)", drained, nemDrainBound)

	// The runbook's resolution, which the checker assumes was taken: every
	// dead letter requeued, every dead outbox row requeued, then quiet.
	// A requeued row can die again on its way (its dead letter is then
	// requeued in the next round), so up to three rounds, each only while
	// the last one requeued something. A platform that lost events never
	// looks complete, and waitQuiet then waits out its longest window:
	// only a round that changed something pays for it.
	for round := 1; round <= 3; round++ {
		requeued := 0
		for _, action := range []string{"outbox-requeue", "dlq-requeue-all"} {
			detail, count, err := n.resolve(ctx, action)
			rec := check.Record{Kind: check.KindOperator, At: time.Now(), Detail: fmt.Sprintf("end of run, round %d: %s", round, detail), Outcome: "ok"}
			if err != nil {
				rec.Outcome = "error: " + err.Error()
			}
			hist.add(rec)
			h.logf("  resolution round %d: %s (%s)", round, detail, rec.Outcome)
			requeued += count
		}
		if round > 1 && requeued == 0 {
			break
		}
		if _, err := p.waitQuiet(ctx, h.prof.Stable); err != nil {
			return fail(row, err)
		}
		if requeued == 0 {
			break
		}
	}
	// The reconciliation report, once the runbook's steps are taken: what
	// it still finds, the checker reports.
	if err := n.reconcileEnd(ctx); err != nil {
		return fail(row, err)
	}
	if err := h.readBack(ctx, p, hist); err != nil {
		return fail(row, fmt.Errorf("reading the history back: %w", err))
	}
	path := filepath.Join(p.Dir, "history.jsonl")
	if err := writeHistory(path, hist.all()); err != nil {
		return fail(row, err)
	}
	res := check.Check(hist.all())
	var table, stories bytes.Buffer
	check.Table(&table, []check.Result{res})
	check.Stories(&stories, res, 3)
	for _, line := range strings.Split(strings.TrimRight(table.String()+"\n"+stories.String(), "\n"), "\n") {
		h.logf("  %s", line)
	}
	h.logf("  history: %s (re-check: go run ./loadtest/prove/check/cmd/recheck %s)", path, path)

	by := res.ByKind()
	row.Orders = res.Orders
	row.Lost = by[check.Loss] + by[check.Unresolved]
	row.Duplicated = by[check.Duplicate]
	row.OutOfOrder = by[check.Order]
	for _, c := range res.Faults {
		row.Faults += c
	}
	row.Faults += res.Operator
	row.Absorbed = p.absorbed()
	row.RecoverySeconds = max(drained, 0)
	row.FaultsDesc = fmt.Sprintf("SEED=%d, %s: %s", seed, relayMode, faultCounts(res))
	targets := ""
	if len(opts.Targets) > 0 {
		targets = " NEMESIS_TARGETS=" + strings.Join(opts.Targets, ",")
	}
	if opts.Topology != "" {
		targets += " NEMESIS_TOPOLOGY=" + opts.Topology
	}
	row.check(true, "SEED=%d NEMESIS=%s: replay with `make prove P=nemesis SEED=%d RELAY_MODES=%s NEMESIS=%s%s NEMESIS_DURATION=%s`",
		seed, strings.Join(kinds, ","), seed, relayMode, strings.Join(kinds, ","), targets, duration)
	row.check(res.Placed[check.OK] > 0, "the load placed orders (%d acknowledged, %d refused, %d unknown)",
		res.Placed[check.OK], res.Placed[check.Refused], res.Placed[check.Unknown])
	for _, k := range check.Kinds {
		row.check(by[k] == 0, "%s findings: %d", k, by[k])
	}
	for i, f := range res.Findings {
		if i >= 20 {
			row.check(false, "… %d more findings in %s", len(res.Findings)-i, path)
			break
		}
		if f.Order == "" {
			row.check(false, "[%s] %s", f.Kind, f.What)
			continue
		}
		row.check(false, "[%s] order %s: %s", f.Kind, f.Order, f.What)
	}
	row.check(true, "history: %s", path)
	return row
}

func faultCounts(r check.Result) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.Faults)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.Faults[k]))
	}
	return strings.Join(parts, ", ") + fmt.Sprintf(", end-of-run requeues %d", r.Operator)
}

func writeHistory(path string, recs []check.Record) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := check.NewWriter(f)
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readBack adds to hist what every component holds: the databases (read as
// the read-only role), the topics and dead-letter topics, the ledger.
func (h *Harness) readBack(ctx context.Context, p *Platform, hist *history) error {
	urls, err := h.readerURLs(ctx, p)
	if err != nil {
		return err
	}
	pools := map[string]*pgxpool.Pool{}
	for svc, url := range urls {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return err
		}
		defer pool.Close()
		pools[svc] = pool
	}
	scan := func(pool *pgxpool.Pool, sql string, each pgx.RowToFunc[check.Record]) error {
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			return err
		}
		recs, err := pgx.CollectRows(rows, each)
		if err != nil {
			return err
		}
		for _, r := range recs {
			hist.add(r)
		}
		return nil
	}
	if err := scan(pools["orders"], sqlNemOrders, func(r pgx.CollectableRow) (check.Record, error) {
		rec := check.Record{Kind: check.KindOrder}
		return rec, r.Scan(&rec.Order, &rec.Status, &rec.Key)
	}); err != nil {
		return err
	}
	for _, svc := range []string{"orders", "billing"} {
		if err := scan(pools[svc], sqlNemOutbox, func(r pgx.CollectableRow) (check.Record, error) {
			rec := check.Record{Kind: check.KindOutbox, Service: svc}
			return rec, r.Scan(&rec.Event, &rec.Type, &rec.Order, &rec.Version, &rec.Status)
		}); err != nil {
			return err
		}
	}
	for _, svc := range []string{"billing", "shim"} {
		for _, sql := range []string{sqlNemInbox, sqlNemParked} {
			if err := scan(pools[svc], sql, func(r pgx.CollectableRow) (check.Record, error) {
				rec := check.Record{Kind: check.KindInbox, Service: svc}
				return rec, r.Scan(&rec.Event, &rec.Type, &rec.Order, &rec.Version, &rec.Status)
			}); err != nil {
				return err
			}
		}
	}
	if err := scan(pools["billing"], sqlNemCharge, func(r pgx.CollectableRow) (check.Record, error) {
		rec := check.Record{Kind: check.KindCharge}
		return rec, r.Scan(&rec.Order, &rec.Status, &rec.Version)
	}); err != nil {
		return err
	}
	for _, t := range []struct{ service, topic, kind string }{
		{"orders", p.OrdersTopic, check.KindMessage}, {"billing", p.BillingTop, check.KindMessage},
		{"orders", p.OrdersTopic + ".dlt", check.KindDeadLetter}, {"billing", p.BillingTop + ".dlt", check.KindDeadLetter},
	} {
		msgs, err := readTopic(ctx, h.stack.Brokers(), t.topic)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			hd := map[string]string{}
			for _, kv := range m.Headers {
				hd[kv.Key] = string(kv.Value)
			}
			v, _ := strconv.ParseInt(hd["aggregate-version"], 10, 64)
			hist.add(check.Record{Kind: t.kind, Service: t.service, Topic: t.topic, Partition: m.Partition, Offset: m.Offset,
				Event: hd["event-id"], Type: hd["event-type"], Order: hd["aggregate-id"], Version: v, At: m.Time,
				Detail: hd["dlt-reason"]})
		}
	}
	ledger, err := p.fullLedger(ctx)
	if err != nil {
		return err
	}
	for i, s := range ledger {
		hist.add(check.Record{Kind: check.KindBooking, Seq: i + 1, Key: s.IdempotencyKey, Order: s.OrderID, Type: s.Kind,
			Detail: s.ID, At: s.ReceivedAt})
	}
	return nil
}

// booking is a ledger entry as the read-back records it.
type booking struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey"`
	OrderID        string    `json:"orderId"`
	Kind           string    `json:"kind"`
	ReceivedAt     time.Time `json:"receivedAt"`
}

func (p *Platform) fullLedger(ctx context.Context) ([]booking, error) {
	var all []booking
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Recon.URL()+"/settlements", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger: %w", err)
	}
	defer resp.Body.Close()
	return all, json.NewDecoder(resp.Body).Decode(&all)
}

// nemClient places and cancels orders as a client that records what it
// saw: ok, refused (4xx), or unknown (no answer within its patience).
type nemClient struct {
	url, prefix string
	hist        *history
	http        http.Client
	next        atomic.Int64
}

// patience is how long a client retries one call (same Idempotency-Key)
// before it records the outcome as unknown.
const patience = 20 * time.Second

func (c *nemClient) drive(ctx context.Context, rate int) {
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := c.next.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, outcome := c.place(ctx, n)
			if outcome == check.OK && n%nemCancelEvery == 0 {
				c.cancel(ctx, id)
			}
		}()
	}
}

func (c *nemClient) place(ctx context.Context, n int64) (string, string) {
	key := fmt.Sprintf("%s-%d", c.prefix, n)
	body, _ := json.Marshal(map[string]any{"customerId": fmt.Sprintf("customer-%d", n%97), "amountCents": 100 + n, "currency": "EUR"})
	at := time.Now()
	id, outcome := c.call(ctx, http.MethodPost, c.url+"/orders", body, key)
	c.hist.add(check.Record{Kind: check.KindPlace, At: at, Key: key, Order: id, Outcome: outcome})
	return id, outcome
}

func (c *nemClient) cancel(ctx context.Context, id string) {
	at := time.Now()
	_, outcome := c.call(ctx, http.MethodPost, c.url+"/orders/"+id+"/cancel", nil, "")
	c.hist.add(check.Record{Kind: check.KindCancel, At: at, Order: id, Outcome: outcome})
}

// call retries until an answer that decides the outcome, or patience runs
// out. The load's context ending does not cut a call short: a call cut
// short would be recorded as unknown for the harness's reason, not the
// platform's.
func (c *nemClient) call(ctx context.Context, method, url string, body []byte, key string) (string, string) {
	cctx := context.WithoutCancel(ctx)
	deadline := time.Now().Add(patience)
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		if attempt > 0 {
			hold(cctx, time.Duration(100+min(attempt, 10)*100)*time.Millisecond)
		}
		req, _ := http.NewRequestWithContext(cctx, method, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := c.http.Do(req)
		if err != nil {
			continue
		}
		var o struct {
			ID uuid.UUID `json:"id"`
		}
		derr := json.NewDecoder(resp.Body).Decode(&o)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusCreated:
			if o.ID != uuid.Nil && derr == nil {
				return o.ID.String(), check.OK
			}
			if key == "" {
				return "", check.OK
			}
		case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusConflict &&
			resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusRequestTimeout:
			return "", check.Refused
		}
	}
	return "", check.Unknown
}
