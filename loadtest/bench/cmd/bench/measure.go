package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/loadtest/bench/rig"
	"github.com/onceflow/onceflow/platform/harness"
)

// This file measures what issue 12 asks of one k6 run, beside k6's own
// report: CPU per order by process (programs, Postgres, Kafka, k6), the two
// Kafka hops' latency per event, the relay's database round trips per
// event, and, for the ramp, each of these per step.

// sample is one reading of the run's counters at a moment.
type sample struct {
	at time.Time
	// cpu is each process group's CPU time so far (rig.Platform.CPUGroups).
	cpu map[string]time.Duration
	// counters are the relays' counters, "orders:<family>" and "billing:<family>".
	counters map[string]float64
}

// sampler reads the counters every interval while a k6 run goes on, so
// that any window of the run (a ramp step) can be costed afterwards.
type sampler struct {
	p     *rig.Platform
	srv   rig.Servers
	pgURL string // the server's, for the backends serving k6
	stop  chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	k6      int
	samples []sample
	// k6Backends is the CPU each Postgres backend serving k6 was last
	// seen with, by pid (chargeK6Queries).
	k6Backends map[int]time.Duration
}

func startSampler(p *rig.Platform, srv rig.Servers, pgURL string, interval time.Duration) *sampler {
	s := &sampler{p: p, srv: srv, pgURL: pgURL, stop: make(chan struct{}), done: make(chan struct{})}
	s.take()
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.take()
			}
		}
	}()
	return s
}

func (s *sampler) take() {
	s.mu.Lock()
	k6 := s.k6
	s.mu.Unlock()
	if k6 == 0 {
		k6 = rig.ChildPID("k6")
	}
	extra := map[string]int{}
	if k6 != 0 {
		extra["k6"] = k6
	}
	smp := sample{at: time.Now(), cpu: s.p.CPUGroups(s.srv, extra), counters: map[string]float64{}}
	s.chargeK6Queries(smp.cpu)
	for name, url := range map[string]string{"orders": s.p.OrdersAdminURL, "billing": s.p.BillingAdminURL, "shim": s.p.ShimAdminURL} {
		text := scrapeMetrics(url)
		counters, _ := harness.SumMetrics(strings.NewReader(text), relayFamily) // a partial scrape counts what it read
		for fam, v := range counters {
			smp.counters[name+":"+fam] = v
		}
		for le, v := range parseBuckets(strings.NewReader(text), hopHistogram) {
			smp.counters[name+":"+hopHistogram+"_bucket|le="+le] = v
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.k6 = k6
	s.samples = append(s.samples, smp)
}

// chargeK6Queries moves the CPU of the Postgres backends serving k6 (its
// settlement poll scans the shim's forwards table every second, its audit
// reads the three databases) from "postgres" to "k6": the load generator's
// work is not the platform's. Each backend counts with the most CPU it was
// seen with, also after it ended (the postmaster's reaped time then holds
// it, which "postgres" includes).
func (s *sampler) chargeK6Queries(cpu map[string]time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pids, err := rig.K6BackendPIDs(ctx, s.pgURL)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.k6Backends == nil {
		s.k6Backends = map[int]time.Duration{}
	}
	if err == nil {
		for _, pid := range pids {
			if st, err := rig.ReadProcStat(pid); err == nil && st.CPU > s.k6Backends[pid] {
				s.k6Backends[pid] = st.CPU
			}
		}
	}
	var total time.Duration
	for _, t := range s.k6Backends {
		total += t
	}
	if pg, ok := cpu["postgres"]; ok {
		cpu["postgres"] = pg - total
	}
	if k6, ok := cpu["k6"]; ok {
		cpu["k6"] = k6 + total
	}
}

// finish takes a last sample and returns them all.
func (s *sampler) finish() []sample {
	close(s.stop)
	<-s.done
	s.take()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// relayFamily tells the counter families the relay cost is computed from:
// events published, and the relay's own claims and round trips (issue 12,
// part 5: outbox_relay_*; absent from relays that predate them).
func relayFamily(name string) bool {
	return name == "outbox_published_total" || strings.HasPrefix(name, "outbox_relay_")
}

// scrapeMetrics returns a program's /metrics, or "" when it does not answer
// (a sample then lacks its counters, and windows around it read n/a).
func scrapeMetrics(adminURL string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/metrics", nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(b)
}

// hopHistogram is the inbox's own hop histogram (pkg/inbox, issue 12):
// from the event's occurredAt, stamped by the producer before its outbox
// write, to the start of its handler. Absent from older inboxes.
const hopHistogram = "inbox_hop_seconds"

// parseBuckets sums the cumulative buckets of histogram name over its
// labels other than le, by le as written.
func parseBuckets(r io.Reader, name string) map[string]float64 {
	out := map[string]float64{}
	prefix := name + "_bucket{"
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			continue
		}
		_, le, ok := strings.Cut(line[len(prefix):end], `le="`)
		if !ok {
			continue
		}
		le, _, _ = strings.Cut(le, `"`)
		f := strings.Fields(line[end+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			out[le] += v
		}
	}
	return out
}

// histogramHop is the hop histogram's growth over [from, to] on service, as
// p50 and p99 interpolated within buckets (as Prometheus's
// histogram_quantile does); ok is false without the histogram or events.
func histogramHop(samples []sample, service string, from, to time.Time) (HopStat, bool) {
	type bucket struct{ le, n float64 }
	var buckets []bucket
	prefix := service + ":" + hopHistogram + "_bucket|le="
	for key := range samples[len(samples)-1].counters {
		le, ok := strings.CutPrefix(key, prefix)
		if !ok {
			continue
		}
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue
		}
		n, ok := delta(samples, from, to, counterOf(key))
		if !ok {
			return HopStat{}, false
		}
		buckets = append(buckets, bucket{bound, n})
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	if len(buckets) == 0 || buckets[len(buckets)-1].n < 1 {
		return HopStat{}, false
	}
	total := buckets[len(buckets)-1].n
	q := func(q float64) float64 {
		rank := q * total
		prevLe, prevN := 0.0, 0.0
		for _, b := range buckets {
			if b.n >= rank {
				if math.IsInf(b.le, 1) {
					return prevLe * 1000
				}
				if b.n == prevN {
					return b.le * 1000
				}
				return (prevLe + (b.le-prevLe)*(rank-prevN)/(b.n-prevN)) * 1000
			}
			prevLe, prevN = b.le, b.n
		}
		return prevLe * 1000
	}
	return HopStat{Events: int(math.Round(total)), P50Ms: q(0.5), P99Ms: q(0.99)}, true
}

// valueAt interpolates a value of the samples at t linearly between the two
// samples around it (CPU and counters only grow, and are read every
// second); ok is false when t is outside the samples or the key is
// missing on either side.
func valueAt(samples []sample, t time.Time, get func(sample) (float64, bool)) (float64, bool) {
	for i := 1; i < len(samples); i++ {
		a, b := samples[i-1], samples[i]
		if t.Before(a.at) || t.After(b.at) {
			continue
		}
		va, okA := get(a)
		vb, okB := get(b)
		if okA && !okB && i >= 2 {
			// The process exited in between (k6, right after its audit):
			// carry on at the rate of the interval before.
			if vp, okP := get(samples[i-2]); okP && a.at.After(samples[i-2].at) {
				slope := (va - vp) / float64(a.at.Sub(samples[i-2].at))
				return va + slope*float64(t.Sub(a.at)), true
			}
		}
		if !okA && okB && i+1 < len(samples) {
			// The process started in between (k6 is found by the first
			// sample after it started): back at the rate of the next interval.
			if vn, okN := get(samples[i+1]); okN && samples[i+1].at.After(b.at) {
				slope := (vn - vb) / float64(samples[i+1].at.Sub(b.at))
				return max(0, vb-slope*float64(b.at.Sub(t))), true
			}
		}
		if !okA || !okB {
			return 0, false
		}
		span := b.at.Sub(a.at)
		if span <= 0 {
			return vb, true
		}
		return va + (vb-va)*float64(t.Sub(a.at))/float64(span), true
	}
	return 0, false
}

func cpuOf(group string) func(sample) (float64, bool) {
	return func(s sample) (float64, bool) {
		d, ok := s.cpu[group]
		return d.Seconds(), ok
	}
}

func counterOf(key string) func(sample) (float64, bool) {
	return func(s sample) (float64, bool) {
		v, ok := s.counters[key]
		return v, ok
	}
}

// delta is a value's growth over [from, to].
func delta(samples []sample, from, to time.Time, get func(sample) (float64, bool)) (float64, bool) {
	a, okA := valueAt(samples, from, get)
	b, okB := valueAt(samples, to, get)
	return b - a, okA && okB
}

// cpuGroups are the process groups CPU is attributed to, in the tables' order.
var cpuGroups = []string{"orders", "billing", "shim", "reconciler", "postgres", "kafka", "k6"}

// programGroups are "the four programs" of issue 12's CPU goal.
var programGroups = []string{"orders", "billing", "shim", "reconciler"}

// The aggregate rows of the CPU figures.
const (
	cpuPrograms = "programs"
	cpuAllButK6 = "all but k6"
	relayClaims = "outbox_relay_claims_total"
)

// isRoundTrips tells the relay's round-trip counters: any
// outbox_relay_*roundtrips*_total (outbox_relay_db_roundtrips_total{op}),
// spelt with or without the underscore.
func isRoundTrips(fam string) bool {
	return strings.HasPrefix(fam, "outbox_relay_") && strings.HasSuffix(fam, "_total") &&
		(strings.Contains(fam, "roundtrips") || strings.Contains(fam, "round_trips"))
}

// cpuPerOrder divides each group's CPU over [from, to] by the orders placed
// in it, in µs, and adds the programs' sum and everything but k6's.
func cpuPerOrder(samples []sample, from, to time.Time, orders int) map[string]float64 {
	if orders == 0 {
		return nil
	}
	out := map[string]float64{}
	for _, g := range cpuGroups {
		if d, ok := delta(samples, from, to, cpuOf(g)); ok {
			out[g] = d / float64(orders) * 1e6
		}
	}
	progs, all := 0.0, 0.0
	complete := true
	for _, g := range programGroups {
		v, ok := out[g]
		complete = complete && ok
		progs += v
	}
	if complete {
		out[cpuPrograms] = progs
		all = progs
		_, okP := out["postgres"]
		_, okK := out["kafka"]
		if okP && okK {
			out[cpuAllButK6] = all + out["postgres"] + out["kafka"]
		}
	}
	return out
}

// RelayCost is one relay's work per event published in a window; NaN is a
// counter the relay does not have (a relay that predates it).
type RelayCost struct {
	Events             float64 `json:"events"`
	ClaimsPerEvent     float64 `json:"claimsPerEvent"`
	RoundTripsPerEvent float64 `json:"roundTripsPerEvent"`
}

// MarshalJSON writes NaN as null, which encoding/json refuses to.
func (c RelayCost) MarshalJSON() ([]byte, error) {
	num := func(v float64) string {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return "null"
		}
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return fmt.Appendf(nil, `{"events":%s,"claimsPerEvent":%s,"roundTripsPerEvent":%s}`,
		num(c.Events), num(c.ClaimsPerEvent), num(c.RoundTripsPerEvent)), nil
}

// UnmarshalJSON reads what MarshalJSON wrote, null as NaN.
func (c *RelayCost) UnmarshalJSON(b []byte) error {
	var raw struct{ Events, ClaimsPerEvent, RoundTripsPerEvent *float64 }
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	val := func(p *float64) float64 {
		if p == nil {
			return math.NaN()
		}
		return *p
	}
	c.Events, c.ClaimsPerEvent, c.RoundTripsPerEvent = val(raw.Events), val(raw.ClaimsPerEvent), val(raw.RoundTripsPerEvent)
	return nil
}

// relayCost computes service's relay cost over [from, to].
func relayCost(samples []sample, service string, from, to time.Time) (RelayCost, bool) {
	events, ok := delta(samples, from, to, counterOf(service+":outbox_published_total"))
	if !ok || events <= 0 {
		return RelayCost{}, false
	}
	c := RelayCost{Events: events, ClaimsPerEvent: math.NaN(), RoundTripsPerEvent: math.NaN()}
	if claims, ok := delta(samples, from, to, counterOf(service+":"+relayClaims)); ok {
		c.ClaimsPerEvent = claims / events
	}
	// Families are read from the last sample: one a relay has is in all.
	var trips float64
	found := false
	for key := range samples[len(samples)-1].counters {
		fam, ok := strings.CutPrefix(key, service+":")
		if !ok || !isRoundTrips(fam) {
			continue
		}
		if d, ok := delta(samples, from, to, counterOf(key)); ok {
			trips += d
			found = true
		}
	}
	if found {
		c.RoundTripsPerEvent = trips / events
	}
	return c, true
}

// HopStat is one hop's latency over the events of a window, in ms.
type HopStat struct {
	Events int     `json:"events"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
}

func hopStat(ms []float64) HopStat {
	if len(ms) == 0 {
		return HopStat{}
	}
	sorted := append([]float64(nil), ms...)
	sort.Float64s(sorted)
	return HopStat{Events: len(sorted), P50Ms: quantile(sorted, 0.5), P99Ms: quantile(sorted, 0.99)}
}

// placedOrder is one order of the run as the databases recorded it.
type placedOrder struct {
	placed  time.Time     // orders.created_at: clock_timestamp() at the order's INSERT
	settled time.Time     // the shim's first capture forward (forwards.forwarded_at), zero if none
	hop1    time.Duration // orders outbox row → billing inbox row; -1 if not seen
	hop2    time.Duration // billing outbox row → shim inbox row; -1 if not seen
	// stages splits the two hops and the shim's work into the steps the
	// databases' timestamps can tell apart (stageNames); -1 where a
	// timestamp is missing.
	stages [len(stageNames)]time.Duration
}

// The hops, from the three databases' own timestamps (one server, one
// clock). A hop starts at the upstream outbox row's created_at, which is
// clock_timestamp() at its INSERT, the last statement of the transaction
// before COMMIT (so the hop includes that commit and its fsync), and ends
// at the downstream inbox row's received_at, which is now(): the start of
// the consumer's transaction that applies (billing) or leases (the shim) the
// event, the moment its handling begins. Rows whose relay deletes them
// (RELAY_MODE=cdc, wal) leave no hop.
const (
	qOrders        = `SELECT id::text, created_at FROM orders WHERE customer_id <> 'warm-up'`
	qSettled       = `SELECT order_id::text, min(forwarded_at) FROM forwards WHERE kind = 'capture' GROUP BY order_id`
	qOutboxEvents  = `SELECT event_id::text, aggregate_id, created_at, published_at FROM outbox_events`
	qInboxReceived = `SELECT message_id::text, min(received_at) FROM inbox_messages GROUP BY message_id`
)

// loadOrders reads every order of the run with its settlement and hops.
func loadOrders(ctx context.Context, p *rig.Platform) ([]placedOrder, error) {
	idTime := func(url, sql string) (map[string]time.Time, error) {
		out := map[string]time.Time{}
		err := query(ctx, url, sql, func(r pgx.Rows) error {
			var id string
			var t time.Time
			if err := r.Scan(&id, &t); err != nil {
				return err
			}
			out[id] = t
			return nil
		})
		return out, err
	}
	outbox := func(url string) ([]outboxEvent, error) {
		var out []outboxEvent
		err := query(ctx, url, qOutboxEvents, func(r pgx.Rows) error {
			var o outboxEvent
			var published *time.Time
			if err := r.Scan(&o.Event, &o.Order, &o.At, &published); err != nil {
				return err
			}
			if published != nil {
				o.Published = *published
			}
			out = append(out, o)
			return nil
		})
		return out, err
	}
	placed, err := idTime(p.OrdersDB, qOrders)
	if err != nil {
		return nil, fmt.Errorf("reading orders: %w", err)
	}
	settled, err := idTime(p.ShimDB, qSettled)
	if err != nil {
		return nil, fmt.Errorf("reading forwards: %w", err)
	}
	billingIn, err := idTime(p.BillingDB, qInboxReceived)
	if err != nil {
		return nil, fmt.Errorf("reading billing's inbox: %w", err)
	}
	shimIn, err := idTime(p.ShimDB, qInboxReceived)
	if err != nil {
		return nil, fmt.Errorf("reading the shim's inbox: %w", err)
	}
	ordersOut, err := outbox(p.OrdersDB)
	if err != nil {
		return nil, fmt.Errorf("reading orders' outbox: %w", err)
	}
	billingOut, err := outbox(p.BillingDB)
	if err != nil {
		return nil, fmt.Errorf("reading billing's outbox: %w", err)
	}
	return joinOrders(placed, settled, ordersOut, billingIn, billingOut, shimIn), nil
}

// outboxEvent is an outbox row: its event id, its order, its created_at
// and its published_at (the start of the polling relay's claim
// transaction, which marks it in the same transaction; zero if not
// published).
type outboxEvent struct {
	Event, Order string
	At           time.Time
	Published    time.Time
}

// joinOrders puts together what loadOrders read: each order's placement
// and settlement, and per hop the first of its events to arrive (an order
// has one event per hop under this load).
func joinOrders(placed, settled map[string]time.Time, ordersOut []outboxEvent, billingIn map[string]time.Time,
	billingOut []outboxEvent, shimIn map[string]time.Time) []placedOrder {
	// arrival is an order's first event of a hop to arrive: the outbox
	// row and the consumer's received_at.
	type arrival struct {
		ev   outboxEvent
		recv time.Time
	}
	hop := func(out []outboxEvent, in map[string]time.Time) map[string]arrival {
		m := map[string]arrival{}
		for _, e := range out {
			recv, ok := in[e.Event]
			if !ok {
				continue
			}
			if a, seen := m[e.Order]; !seen || recv.Sub(e.At) < a.recv.Sub(a.ev.At) {
				m[e.Order] = arrival{ev: e, recv: recv}
			}
		}
		return m
	}
	h1, h2 := hop(ordersOut, billingIn), hop(billingOut, shimIn)
	out := make([]placedOrder, 0, len(placed))
	for id, at := range placed {
		o := placedOrder{placed: at, settled: settled[id], hop1: -1, hop2: -1}
		for i := range o.stages {
			o.stages[i] = -1
		}
		a1, ok1 := h1[id]
		a2, ok2 := h2[id]
		if ok1 {
			o.hop1 = a1.recv.Sub(a1.ev.At)
		}
		if ok2 {
			o.hop2 = a2.recv.Sub(a2.ev.At)
		}
		o.stages = orderStages(o, a1.ev.At, a1.ev.Published, a1.recv, a2.ev.At, a2.ev.Published, a2.recv)
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].placed.Before(out[j].placed) })
	return out
}

// Window is a stretch of a run at one offered rate (a ramp step's plateau,
// or a steady run's whole load) and what the platform did in it.
type Window struct {
	Rate  float64   `json:"rate"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// PlacedPerSecond: orders committed in the window (orders.created_at).
	PlacedPerSecond float64 `json:"placedPerSecond"`
	// SettledPerSecond: settlements in the window (forwards.forwarded_at),
	// whichever order they belong to.
	SettledPerSecond float64 `json:"settledPerSecond"`
	// Unsettled counts the window's orders never settled.
	Unsettled int `json:"unsettled"`
	// LagFirstMs and LagLastMs are the median commit → settlement lag of the
	// orders placed in the window's first and last quarter; LagGrowing is
	// the last exceeding the first by more than the 100 ms lag budget, or
	// an order of the last quarter never settled, or none was placed then.
	LagFirstMs float64 `json:"lagFirstMs"`
	LagLastMs  float64 `json:"lagLastMs"`
	LagGrowing bool    `json:"lagGrowing"`
	// Hops: orders outbox commit → billing handler start, and billing
	// outbox commit → shim handler start, for the window's orders.
	Hop1 HopStat `json:"hopOrdersBilling"`
	Hop2 HopStat `json:"hopBillingShim"`
	// Stages splits the window's orders' path into the steps the
	// databases' timestamps tell apart (stageNames), each with its p50
	// and p99; a step no order of the window has a timestamp for is left
	// out (the log-based relays record no published_at).
	Stages []StageStat `json:"stages,omitempty"`
	// HopMetric is the consumers' own inbox_hop_seconds over the window
	// (occurredAt → handler start), by consumer program (billing: hop 1,
	// shim: hop 2), where the programs export it.
	HopMetric map[string]HopStat `json:"hopMetric,omitempty"`
	// CPUPerOrderUs is each process group's CPU over the window per order
	// placed in it, plus "programs" and "all but k6".
	CPUPerOrderUs map[string]float64 `json:"cpuPerOrderUs,omitempty"`
	// Relay is each relay's cost per event published in the window.
	Relay map[string]RelayCost `json:"relay,omitempty"`
}

// lagBudget is the lag a step may add over its length and still count as
// not growing: issue 12's p99 budget.
const lagBudget = 100 * time.Millisecond

// window computes a Window from the run's orders and samples.
func window(rate float64, from, to time.Time, orders []placedOrder, samples []sample) Window {
	w := Window{Rate: rate, Start: from, End: to}
	secs := to.Sub(from).Seconds()
	if secs <= 0 {
		return w
	}
	q := to.Sub(from) / 4
	var first, last, hop1, hop2 []float64
	var stages [len(stageNames)][]float64
	lastUnsettled := false
	n, settledIn := 0, 0
	for _, o := range orders {
		if !o.settled.IsZero() && !o.settled.Before(from) && o.settled.Before(to) {
			settledIn++
		}
		if o.placed.Before(from) || !o.placed.Before(to) {
			continue
		}
		n++
		lag := math.NaN()
		if o.settled.IsZero() {
			w.Unsettled++
		} else {
			lag = float64(o.settled.Sub(o.placed).Microseconds()) / 1000
		}
		switch {
		case o.placed.Before(from.Add(q)):
			if !math.IsNaN(lag) {
				first = append(first, lag)
			}
		case !o.placed.Before(to.Add(-q)):
			if math.IsNaN(lag) {
				lastUnsettled = true
			} else {
				last = append(last, lag)
			}
		}
		if o.hop1 >= 0 {
			hop1 = append(hop1, float64(o.hop1.Microseconds())/1000)
		}
		if o.hop2 >= 0 {
			hop2 = append(hop2, float64(o.hop2.Microseconds())/1000)
		}
		for i, d := range o.stages {
			if d >= 0 {
				stages[i] = append(stages[i], float64(d.Microseconds())/1000)
			}
		}
	}
	w.PlacedPerSecond = float64(n) / secs
	w.SettledPerSecond = float64(settledIn) / secs
	w.LagFirstMs, w.LagLastMs = median(first), median(last)
	// No order at all in the last quarter, while the first had some, is the
	// load generator holding back for a backlog (ramp.js's
	// MAX_BACKLOG_SECONDS): a lag that grew, not one that held.
	starved := n > 0 && len(last) == 0
	w.LagGrowing = lastUnsettled || starved || w.LagLastMs-w.LagFirstMs > float64(lagBudget.Milliseconds())
	w.Hop1, w.Hop2 = hopStat(hop1), hopStat(hop2)
	for i, ms := range stages {
		if len(ms) > 0 {
			w.Stages = append(w.Stages, StageStat{Stage: stageNames[i], HopStat: hopStat(ms)})
		}
	}
	w.CPUPerOrderUs = cpuPerOrder(samples, from, to, n)
	for _, svc := range []string{"billing", "shim"} {
		if len(samples) == 0 {
			break
		}
		if h, ok := histogramHop(samples, svc, from, to); ok {
			if w.HopMetric == nil {
				w.HopMetric = map[string]HopStat{}
			}
			w.HopMetric[svc] = h
		}
	}
	for _, svc := range []string{"orders", "billing"} {
		if c, ok := relayCost(samples, svc, from, to); ok {
			if w.Relay == nil {
				w.Relay = map[string]RelayCost{}
			}
			w.Relay[svc] = c
		}
	}
	return w
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return quantile(s, 0.5)
}

// rampWindows are the plateaus of ramp.js's steps: each step climbs for
// rampSeconds, then holds for hold. t0 is when the load began, taken as the
// first order's commit.
func rampWindows(steps []float64, hold time.Duration, t0 time.Time) [][2]time.Time {
	const rampSeconds = 3 * time.Second // ramp.js
	period := rampSeconds + hold
	out := make([][2]time.Time, len(steps))
	for i := range steps {
		start := t0.Add(time.Duration(i)*period + rampSeconds)
		out[i] = [2]time.Time{start, start.Add(hold)}
	}
	return out
}
