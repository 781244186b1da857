package prove

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/platform/harness"
)

// Audit is what the three databases and the third party's ledger say after
// a run has gone quiet.
type Audit struct {
	Orders   int // orders committed in the orders database
	Accepted int // orders the API acknowledged to the client
	// AcceptedMissing: acknowledged to the client, yet not in the database.
	AcceptedMissing int
	// EventlessOrders: orders without an OrderPlaced outbox row (outbox mode
	// only: the naive mode writes none).
	EventlessOrders int
	// OrphanEvents: OrderPlaced outbox rows whose order does not exist.
	OrphanEvents        int
	OrdersPending       int // orders outbox rows not yet published
	Charges             int
	OrdersWithoutCharge int // the OrderPlaced never took effect in billing
	ChargesWithoutOrder int
	BillingPending      int
	// SettledOrders have at least one capture in the ledger.
	SettledOrders            int
	ChargesWithoutSettlement int
	// DuplicateEffects counts, per order, the captures beyond the first,
	// the larger of billing's PaymentCaptured events and the ledger's bookings.
	DuplicateEffects int
	// LedgerDuplicateKeys is the ledger's own count: bookings under an
	// idempotency key it had booked before.
	LedgerDuplicateKeys int
	// BillingInboxRows and BillingInboxMessages: inbox rows of billing, and
	// the distinct event ids billing's topic holds.
	BillingInboxRows int
	Settlements      int

	// Cancelled orders (status cancelled in the orders database); the
	// production-shaped proofs cancel some orders right after placing them,
	// so each such aggregate has two events whose order matters.
	Cancelled int
	// CancelledNotRefunded: cancelled orders whose charge stands. Billing
	// refunds only a charge it has, so this is an OrderCancelled handled
	// before its OrderPlaced (or never).
	CancelledNotRefunded int
	// RefundsWithoutSettlement: refunded charges the third party never
	// booked a refund for.
	RefundsWithoutSettlement int
	// DuplicateRefunds counts, per order, the refunds beyond the first, the
	// larger of billing's PaymentRefunded events and the ledger's bookings.
	DuplicateRefunds int
	// BillingOutOfOrder: orders whose PaymentRefunded was written to
	// billing's outbox before their PaymentCaptured.
	BillingOutOfOrder int
	// LedgerOutOfOrder: orders whose refund the third party booked before
	// their capture, or without one.
	LedgerOutOfOrder int
}

// OutOfOrder is every per-aggregate order violation the audit sees
// downstream of orders: at billing and at the third party.
func (a Audit) OutOfOrder() int {
	return a.CancelledNotRefunded + a.BillingOutOfOrder + a.LedgerOutOfOrder
}

// Lost is every order whose effect is missing downstream, or that the client
// was told about and does not exist.
func (a Audit) Lost() int {
	return a.AcceptedMissing + a.OrdersWithoutCharge + a.ChargesWithoutSettlement
}

// settlement is the part of the ledger's record the audit reads.
type settlement struct {
	IdempotencyKey string `json:"idempotencyKey"`
	OrderID        string `json:"orderId"`
	Kind           string `json:"kind"`
}

func (p *Platform) ledger(ctx context.Context) ([]settlement, error) {
	var all []settlement
	if err := harness.GetJSON(ctx, p.Recon.URL()+"/settlements", &all); err != nil {
		return nil, fmt.Errorf("reading the ledger: %w", err)
	}
	return all, nil
}

// audit reads everything. accepted are the ids the driver was acknowledged.
func (p *Platform) audit(ctx context.Context, accepted map[uuid.UUID]time.Time) (Audit, error) {
	var a Audit
	a.Accepted = len(accepted)
	orders, err := idSet(ctx, p.ordersPool, `SELECT id::text FROM orders`)
	if err != nil {
		return a, err
	}
	a.Orders = len(orders)
	for id := range accepted {
		if !orders[id.String()] {
			a.AcceptedMissing++
		}
	}
	events, err := countBy(ctx, p.ordersPool, `SELECT aggregate_id FROM outbox_events WHERE event_type = 'OrderPlaced'`)
	if err != nil {
		return a, err
	}
	// The log-based modes keep no row to check against: wal writes none, cdc
	// deletes rows once confirmed. Their lost events show end to end
	// (OrdersWithoutCharge), and orphans as ChargesWithoutOrder. Under
	// Debezium the rows stay (until OUTBOX_RETENTION).
	if (p.relayMode() == "poll" || p.relayMode() == "debezium") && (len(events) > 0 || p.publishMode() == "outbox") {
		a.EventlessOrders, a.OrphanEvents = notIn(orders, events), notIn(events, orders)
	}
	if err := p.ordersPool.QueryRow(ctx, pendingQuery(p.relayMode())).Scan(&a.OrdersPending); err != nil {
		return a, err
	}
	if p.Billing == nil {
		return a, nil
	}
	charges, err := idSet(ctx, p.billingPool, `SELECT order_id::text FROM charges`)
	if err != nil {
		return a, err
	}
	a.Charges = len(charges)
	a.OrdersWithoutCharge, a.ChargesWithoutOrder = notIn(orders, charges), notIn(charges, orders)
	if err := p.billingPool.QueryRow(ctx, pendingQuery(p.billingRelayMode())).Scan(&a.BillingPending); err != nil {
		return a, err
	}
	if err := p.billingPool.QueryRow(ctx, `SELECT count(*) FROM inbox_messages`).Scan(&a.BillingInboxRows); err != nil {
		return a, err
	}
	captured, err := countBy(ctx, p.billingPool, `SELECT aggregate_id FROM outbox_events WHERE event_type = 'PaymentCaptured'`)
	if err != nil {
		return a, err
	}
	ledger, err := p.ledger(ctx)
	if err != nil {
		return a, err
	}
	a.Settlements = len(ledger)
	booked := map[string]int{}
	refundsBooked := map[string]int{}
	keys := map[string]int{}
	for _, s := range ledger {
		keys[s.IdempotencyKey]++
		switch s.Kind {
		case "capture":
			booked[s.OrderID]++
		case "refund":
			// The ledger lists bookings in the order it made them.
			if booked[s.OrderID] == 0 && refundsBooked[s.OrderID] == 0 {
				a.LedgerOutOfOrder++
			}
			refundsBooked[s.OrderID]++
		}
	}
	for _, n := range keys {
		a.LedgerDuplicateKeys += n - 1
	}
	a.SettledOrders = len(booked)
	a.ChargesWithoutSettlement = notIn(charges, booked)
	for id := range charges {
		a.DuplicateEffects += max(0, captured[id]-1, booked[id]-1)
	}
	return a, p.auditCancellations(ctx, &a, refundsBooked)
}

// auditCancellations fills the cancellation and ordering part of a.
func (p *Platform) auditCancellations(ctx context.Context, a *Audit, refundsBooked map[string]int) error {
	cancelled, err := idSet(ctx, p.ordersPool, `SELECT id::text FROM orders WHERE status = 'cancelled'`)
	if err != nil {
		return err
	}
	a.Cancelled = len(cancelled)
	refunded, err := idSet(ctx, p.billingPool, `SELECT order_id::text FROM charges WHERE status = 'refunded'`)
	if err != nil {
		return err
	}
	charged, err := idSet(ctx, p.billingPool, `SELECT order_id::text FROM charges`)
	if err != nil {
		return err
	}
	for id := range cancelled {
		if charged[id] && !refunded[id] {
			a.CancelledNotRefunded++
		}
	}
	a.RefundsWithoutSettlement = notIn(refunded, refundsBooked)
	refundEvents, err := countBy(ctx, p.billingPool, `SELECT aggregate_id FROM outbox_events WHERE event_type = 'PaymentRefunded'`)
	if err != nil {
		return err
	}
	for id := range refunded {
		a.DuplicateRefunds += max(0, refundEvents[id]-1, refundsBooked[id]-1)
	}
	return p.billingPool.QueryRow(ctx, `SELECT count(*) FROM outbox_events r
		WHERE r.event_type = 'PaymentRefunded' AND NOT EXISTS (
			SELECT 1 FROM outbox_events c WHERE c.event_type = 'PaymentCaptured'
			AND c.aggregate_id = r.aggregate_id AND c.id < r.id)`).Scan(&a.BillingOutOfOrder)
}

func (p *Platform) publishMode() string { return p.API.env("PUBLISH_MODE") }

func (p *Platform) relayMode() string { return p.API.env("RELAY_MODE") }

// billingRelayMode is billing's RELAY_MODE: orders' but for debezium, whose
// connector publishes orders' outbox only.
func (p *Platform) billingRelayMode() string {
	if p.Billing == nil {
		return p.relayMode()
	}
	return p.Billing.env("RELAY_MODE")
}

// pendingQuery counts the events of an outbox in relay mode mode not yet
// published. Under Debezium every row stays pending and what it has not
// published is in the WAL, where no query sees it: only dead rows count (a
// run is complete when every order is charged, see waitQuiet). wal has no
// rows. The log-based relay (cdc) never marks a row either: see
// cdcPendingQuery.
func pendingQuery(mode string) string {
	switch mode {
	case "poll":
		return `SELECT count(*) FROM outbox_events WHERE state <> 'published'`
	case "debezium":
		return `SELECT count(*) FROM outbox_events WHERE state = 'dead'`
	}
	return cdcPendingQuery
}

// cdcPendingQuery is what the log-based relay has not published: the dead
// rows, and every pending row whose inserting transaction is not older than
// the slot record's published_xmin, the commit-ordered horizon the relay
// moves only once the slot confirmed (Kafka acknowledged) every transaction
// older than it (pkg/outbox, migration 0008). A row at or below
// confirmed_id, the highest id of the confirmed transactions, is not
// therefore published: ids are drawn at INSERT, not at commit, so a
// transaction that inserted first and commits last has its row below
// confirmed_id before anything published it, and the audit's earlier test
// (id > confirmed_id, kept as idCDCPendingQuery in audit_internal_test.go)
// called it published. No published_xmin yet (NULL)
// counts every pending row. age() compares xids across wraparound; a frozen
// xmin is the oldest of all.
const cdcPendingQuery = `SELECT count(*) FROM outbox_events o
		WHERE o.state = 'dead'
		   OR (o.state = 'pending' AND NOT EXISTS (SELECT 1 FROM outbox_cdc_slots s
		          WHERE s.published_xmin IS NOT NULL AND age(o.xmin) > age(s.published_xmin)))`

// idSet is the set of ids sql returns.
func idSet(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string) (map[string]bool, error) {
	counts, err := countBy(ctx, db, sql)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(counts))
	for id := range counts {
		out[id] = true
	}
	return out, nil
}

// countBy counts how many times sql returns each id.

func countBy(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string) (map[string]int, error) {
	rows, err := db.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, id := range ids {
		out[id]++
	}
	return out, nil
}

// notIn counts the ids of from that in does not hold. Both maps hold only
// the ids seen (idSet, countBy), so holding an id is having seen it.
func notIn[A, B any](from map[string]A, in map[string]B) int {
	n := 0
	for id := range from {
		if _, ok := in[id]; !ok {
			n++
		}
	}
	return n
}

// progress is the cheap view waitQuiet watches.
type progress struct {
	orders, pending, charges, billingPending, settlements int
	refunded                                              int
	lag                                                   int64
	// dead and billingDead are the outbox rows parked as dead: counted in
	// pending, yet not in flight (nothing retries them until requeued).
	dead, billingDead int
}

// inFlight reports whether work is still under way that can change the
// outcome: events waiting for a relay, or messages a consumer group has not
// committed. A process that is restarting (a crash point, a rejoin) leaves
// its work here, however long its restart takes on a busy machine.
func (g progress) inFlight() bool {
	return g.pending > g.dead || g.billingPending > g.billingDead || g.lag > 0
}

func (p *Platform) progress(ctx context.Context) (progress, error) {
	var g progress
	// Pending as the audit counts it (pendingQuery): under the log-based
	// relay rows stay 'pending' after they are published, and counting them
	// kept a cdc run "in flight" until waitQuiet gave up after 10×stable.
	if err := p.ordersPool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (`+pendingQuery(p.relayMode())+`),
		(SELECT count(*) FROM outbox_events WHERE state = 'dead')`).
		Scan(&g.orders, &g.pending, &g.dead); err != nil {
		return g, err
	}
	if p.Billing == nil {
		return g, nil
	}
	if err := p.billingPool.QueryRow(ctx, `SELECT (SELECT count(*) FROM charges), (`+pendingQuery(p.billingRelayMode())+`),
		(SELECT count(*) FROM charges WHERE status = 'refunded'), (SELECT count(*) FROM outbox_events WHERE state = 'dead')`).
		Scan(&g.charges, &g.billingPending, &g.refunded, &g.billingDead); err != nil {
		return g, err
	}
	var stats struct {
		Settlements int `json:"settlements"`
	}
	if err := harness.GetJSON(ctx, p.Recon.URL()+"/stats", &stats); err != nil {
		return g, err
	}
	g.settlements = stats.Settlements
	brokers := p.h.stack.Brokers()
	l1, err := groupLag(ctx, brokers, p.Billing.env("CONSUMER_GROUP"), p.OrdersTopic)
	if err != nil {
		return g, err
	}
	l2, err := groupLag(ctx, brokers, p.ShimGroup, p.BillingTop)
	if err != nil {
		return g, err
	}
	g.lag = l1 + l2
	return g, nil
}

// waitQuiet waits until the platform is done: nothing pending, no lag,
// every order charged and settled, and nothing changing for 3s; or, when
// that never comes (a naive mode lost something), nothing in flight and
// nothing changing for stable. Work in flight that does not move for ten
// times stable is given up on too (the audit then says what is missing).
// It returns when it became quiet.
func (p *Platform) waitQuiet(ctx context.Context, stable time.Duration) (time.Time, error) {
	var last progress
	lastChange := time.Now()
	deadline := time.Now().Add(10 * time.Minute)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		g, err := p.progress(ctx)
		if err == nil {
			if g != last {
				last, lastChange = g, time.Now()
			}
			complete := g.pending == 0 && g.billingPending == 0 && g.lag == 0 &&
				(p.Billing == nil || (g.charges == g.orders && g.settlements >= g.charges+g.refunded))
			still := time.Since(lastChange)
			// Under the log-based relay an event the relay has not streamed
			// yet is in the WAL, where progress cannot count it: a relay
			// still restarting on a busy machine looks like nothing in
			// flight (relay-crash lost 2–3 "events" that way under load).
			// There, only a complete run or the long wait ends it early.
			seesInFlight := p.relayMode() == "poll"
			if (complete && still >= 3*time.Second) || (seesInFlight && !g.inFlight() && still >= stable) || still >= 10*stable {
				return lastChange, nil
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%s did not go quiet within 10 minutes (last: %+v, error %v)", p.Name, last, err)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-t.C:
		}
	}
}
