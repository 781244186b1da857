package prove

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/platform/kafkautil"
)

// snapshot is the state a replay must leave unchanged.
type snapshot struct {
	Charges, BillingEvents, BillingInbox, Settlements int
}

func (p *Platform) snapshot(ctx context.Context) (snapshot, error) {
	var s snapshot
	err := p.billingPool.QueryRow(ctx, `SELECT (SELECT count(*) FROM charges), (SELECT count(*) FROM outbox_events),
		(SELECT count(*) FROM inbox_messages)`).Scan(&s.Charges, &s.BillingEvents, &s.BillingInbox)
	if err != nil {
		return s, err
	}
	ledger, err := p.ledger(ctx)
	s.Settlements = len(ledger)
	return s, err
}

// replay: a past window of the orders outbox is replayed (POST
// /admin/outbox/replay, same event ids), then billing is restarted in a fresh
// consumer group, which reads the whole topic again. Nothing may change, and
// every replayed event must be counted as a duplicate.
func (h *Harness) replay(ctx context.Context, _ bool) Row {
	var row Row
	p, err := h.newPlatform(ctx, "replay", Setup{})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	d, err := h.placeAndSettle(ctx, p)
	if err != nil {
		return fail(row, err)
	}
	before, err := p.snapshot(ctx)
	if err != nil {
		return fail(row, err)
	}
	// The window: the older half of the orders (a replay always takes one).
	var first, mid time.Time
	if err := p.ordersPool.QueryRow(ctx, `SELECT min(created_at), percentile_disc(0.5) WITHIN GROUP (ORDER BY created_at) FROM outbox_events`).Scan(&first, &mid); err != nil {
		return fail(row, err)
	}
	dupsBefore := p.Billing.Counter("inbox_duplicates_total")
	body, _ := json.Marshal(map[string]any{"aggregateType": "order", "from": first, "to": mid, "dryRun": false})
	var resp struct {
		Events []json.RawMessage `json:"events"`
	}
	if err := postJSON(ctx, p.API.AdminURL()+"/admin/outbox/replay", body, &resp); err != nil {
		return fail(row, err)
	}
	replayed := resp.Events
	started := time.Now()
	h.logf("  replayed %d events of the window before %s; waiting for billing to absorb them …", len(replayed), mid.Format(time.RFC3339Nano))
	err = waitUntil(ctx, 2*time.Minute, func() bool {
		return p.Billing.Counter("inbox_duplicates_total")-dupsBefore >= float64(len(replayed))
	})
	if err != nil {
		row.Error = fmt.Sprintf("billing counted %.0f of %d replayed events as duplicates", p.Billing.Counter("inbox_duplicates_total")-dupsBefore, len(replayed))
	}
	absorbedOutbox := int(p.Billing.Counter("inbox_duplicates_total") - dupsBefore)

	// Kafka's side: a fresh consumer group reads the topic from the start,
	// with the same inbox behind it.
	all, err := readTopic(ctx, h.stack.Brokers(), p.OrdersTopic)
	if err != nil {
		return fail(row, err)
	}
	h.logf("  restarting billing in a fresh consumer group: %d messages to read again …", len(all))
	dupsBefore = p.Billing.Counter("inbox_duplicates_total")
	if err := p.Billing.Restart(ctx, map[string]string{"CONSUMER_GROUP": p.BillingGroup + "_replay"}); err != nil {
		return fail(row, err)
	}
	err = waitUntil(ctx, 2*time.Minute, func() bool {
		lag, err := groupLag(ctx, h.stack.Brokers(), p.BillingGroup+"_replay", p.OrdersTopic)
		return err == nil && lag == 0 && p.Billing.Counter("inbox_duplicates_total")-dupsBefore >= float64(len(all))
	})
	if err != nil && row.Error == "" {
		row.Error = "the fresh consumer group did not catch up within 2 minutes"
	}
	absorbedGroup := int(p.Billing.Counter("inbox_duplicates_total") - dupsBefore)
	quietAt, err := p.waitQuiet(ctx, h.prof.Stable)
	if err != nil {
		return fail(row, err)
	}
	after, err := p.snapshot(ctx)
	if err != nil {
		return fail(row, err)
	}
	a, err := p.audit(ctx, d.Accepted())
	if err != nil {
		return fail(row, err)
	}
	row.Faults = len(replayed) + len(all)
	row.FaultsDesc = fmt.Sprintf("outbox replay of %d events (the older half), then a fresh consumer group re-reading all %d messages", len(replayed), len(all))
	row.Absorbed = absorbedOutbox + absorbedGroup
	row.RecoverySeconds = recoverySince(started, quietAt)
	row.check(len(replayed) > 0, "the window held events to replay (%d)", len(replayed))
	row.check(absorbedOutbox == len(replayed), "every replayed event was counted as a duplicate (%d of %d)", absorbedOutbox, len(replayed))
	row.check(absorbedGroup == len(all), "every message the fresh group re-read was counted as a duplicate (%d of %d)", absorbedGroup, len(all))
	row.check(after == before, "state unchanged: charges, billing events, inbox rows, ledger bookings %v, before %v", after, before)
	endToEnd(&row, a)
	return row
}

// postJSON posts to an operator endpoint (on a Proc's AdminURL) with the token.
func postJSON(ctx context.Context, url string, body []byte, out any) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &statusError{url: url, code: resp.StatusCode, status: resp.Status}
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// statusError is an answer other than 200 OK from an admin endpoint.
type statusError struct {
	url, status string
	code        int
}

func (e *statusError) Error() string { return fmt.Sprintf("POST %s: %s", e.url, e.status) }

// alertAge is the backlog alert's threshold on outbox_oldest_pending_age_seconds.
const alertAge = 10.0

// backlog: the relay is stopped under steady load; the backlog gauges on
// /metrics rise and the alert condition (oldest pending older than 10s)
// holds within 30s; the relay restarts and the backlog drains to zero.
func (h *Harness) backlog(ctx context.Context, _ bool) Row {
	var row Row
	p, err := h.newPlatform(ctx, "backlog", Setup{APIOnly: true})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	relay := p.Orders[0]
	d := newDriver(p.API.URL(), p.Name)
	lctx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan struct{})
	go func() { d.Drive(lctx, 2, 20, 0, 1<<30, nil); close(loadDone) }()
	defer func() { stopLoad(); <-loadDone }()
	gauges := func() (pending, age float64) {
		m, err := p.API.Metrics()
		if err != nil {
			return -1, -1
		}
		return m["outbox_pending_events"], m["outbox_oldest_pending_age_seconds"]
	}
	if err := waitUntil(ctx, 30*time.Second, func() bool { n, _, _ := d.Stats(); return n >= 40 }); err != nil {
		return fail(row, fmt.Errorf("the load did not start: %w", err))
	}
	h.logf("  stopping the relay under load (20 orders/s) …")
	relay.Stop()
	stopped := time.Now()
	var alertAt time.Time
	var pendingStart, pendingAtAlert, ageAtAlert float64 = -1, 0, 0
	err = waitUntil(ctx, 45*time.Second, func() bool {
		pending, age := gauges()
		if pendingStart < 0 && time.Since(stopped) > 3*time.Second {
			pendingStart = pending
		}
		if age > alertAge {
			alertAt, pendingAtAlert, ageAtAlert = time.Now(), pending, age
			return true
		}
		return false
	})
	if err != nil {
		row.Error = "the alert condition never held"
	}
	alertAfter := alertAt.Sub(stopped).Seconds()
	h.logf("  alert condition (outbox_oldest_pending_age_seconds %.1f > %.0f) after %.1fs, %.0f pending; restarting the relay …", ageAtAlert, alertAge, alertAfter, pendingAtAlert)
	if err := relay.Restart(ctx, nil); err != nil {
		return fail(row, err)
	}
	restarted := time.Now()
	var drainedAt time.Time
	err = waitUntil(ctx, 2*time.Minute, func() bool {
		pending, age := gauges()
		if pending == 0 && age == 0 {
			drainedAt = time.Now()
			return true
		}
		return false
	})
	if err != nil && row.Error == "" {
		row.Error = "the backlog did not drain to zero within 2 minutes"
	}
	stopLoad()
	<-loadDone
	a, _, err := h.settleAndAudit(ctx, p, d)
	if err != nil {
		return fail(row, err)
	}
	row.Faults = 1
	row.FaultsDesc = fmt.Sprintf("relay stopped for %.0fs under 20 orders/s", restarted.Sub(stopped).Seconds())
	row.RecoverySeconds = recoverySince(restarted, drainedAt)
	row.check(pendingAtAlert > pendingStart && pendingStart >= 0, "outbox_pending_events rose while the relay was down (%.0f after 3s, %.0f at the alert)", pendingStart, pendingAtAlert)
	row.check(!alertAt.IsZero() && alertAfter <= 30, "the alert condition outbox_oldest_pending_age_seconds > %.0f held within 30s of the stop (%.1fs)", alertAge, alertAfter)
	row.check(!drainedAt.IsZero(), "after the restart the backlog drained to zero (in %.1fs)", row.RecoverySeconds)
	endToEnd(&row, a)
	return row
}

// poison: malformed messages, events of an unknown version and events whose
// payload breaks the contract are produced among valid orders: each lands in
// the dead-letter topic with its reason, the valid orders all settle, and the
// consumer group's lag returns to zero.
func (h *Harness) poison(ctx context.Context, _ bool) Row {
	var row Row
	p, err := h.newPlatform(ctx, "poison", Setup{})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	d := newDriver(p.API.URL(), p.Name)
	h.logf("  placing %d orders with %d poison messages among them …", h.prof.Orders, 3*h.prof.Poison)
	loadDone := make(chan struct{})
	go func() { d.Drive(ctx, 2, 30, h.prof.Orders, h.prof.Orders, nil); close(loadDone) }()
	w := kafkautil.NewWriter(h.stack.Brokers(), 10)
	defer w.Close()
	poison := map[string]string{} // key -> kind
	for i := range h.prof.Poison {
		malformed := uuid.NewString()
		poison[malformed] = "malformed"
		id := uuid.New()
		newVersion := event.Envelope{EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 99, AggregateType: "order",
			AggregateID: id.String(), AggregateVersion: 1, OccurredAt: time.Now(), Payload: json.RawMessage(`{"orderId":"` + id.String() + `"}`)}
		poison[id.String()] = "unknown version"
		id2 := uuid.New()
		badPayload := event.Envelope{EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
			AggregateID: id2.String(), AggregateVersion: 1, OccurredAt: time.Now(), Payload: json.RawMessage(`{"orderId":"` + id2.String() + `","amountCents":-5}`)}
		poison[id2.String()] = "payload breaks the contract"
		msgs := []kafka.Message{
			{Topic: p.OrdersTopic, Key: []byte(malformed), Value: []byte(fmt.Sprintf("{not json %d", i))},
			event.ToKafka(p.OrdersTopic, newVersion),
			event.ToKafka(p.OrdersTopic, badPayload),
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return fail(row, fmt.Errorf("producing poison: %w", err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond): // spread them through the load
		}
	}
	<-loadDone
	a, _, err := h.settleAndAudit(ctx, p, d)
	if err != nil {
		return fail(row, err)
	}
	dlt, err := readTopic(ctx, h.stack.Brokers(), p.OrdersTopic+".dlt")
	if err != nil {
		return fail(row, err)
	}
	found, withReason, foreign := 0, 0, 0
	for _, m := range dlt {
		if _, ok := poison[string(m.Key)]; !ok {
			foreign++
			continue
		}
		found++
		if headerValue(m, inboxadmin.HeaderDLTReason) != "" {
			withReason++
		}
	}
	lag, err := groupLag(ctx, h.stack.Brokers(), p.BillingGroup, p.OrdersTopic)
	if err != nil {
		return fail(row, err)
	}
	row.Faults = len(poison)
	row.FaultsDesc = fmt.Sprintf("%d malformed, %d unknown-version and %d contract-breaking messages", h.prof.Poison, h.prof.Poison, h.prof.Poison)
	row.Absorbed = p.absorbed()
	row.check(found == len(poison), "every poison message is in %s.dlt (%d of %d)", p.OrdersTopic, found, len(poison))
	row.check(withReason == len(poison), "each dead letter carries its reason in the %s header (%d of %d)", inboxadmin.HeaderDLTReason, withReason, len(poison))
	row.check(foreign == 0, "no valid event was dead-lettered (%d)", foreign)
	row.check(lag == 0, "billing's consumer lag is back to zero (%d)", lag)
	endToEnd(&row, a)
	return row
}
