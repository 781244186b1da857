package journey

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
)

// topics reads the order's records from the two topics and their
// dead-letter topics (the order id is every record's key).
func (r *reader) topics(ctx context.Context) {
	since := r.now
	for _, s := range r.j.Steps {
		if s.At.Before(since) {
			since = s.At
		}
	}
	since = since.Add(-r.src.ScanFrom)
	r.records = map[string][]record{}
	for _, topic := range []string{r.src.OrdersTopic, r.src.BillingTopic, r.src.OrdersTopic + ".dlt", r.src.BillingTopic + ".dlt"} {
		recs, cut, err := Scan(ctx, r.src.Brokers, topic, ScanConfig{Since: since, Key: r.j.OrderID, Max: r.src.MaxScan})
		if err != nil {
			r.j.Notes = append(r.j.Notes, fmt.Sprintf("topic %s not read: %v", topic, err))
			continue
		}
		if cut {
			r.j.Notes = append(r.j.Notes, fmt.Sprintf("topic %s: stopped after %d records; later ones not read", topic, r.src.MaxScan))
		}
		r.records[topic] = recs
		for _, rec := range recs {
			r.recordStep(rec)
		}
	}
}

func (r *reader) recordStep(rec record) {
	p, o := rec.Partition, rec.Offset
	s := Step{At: rec.Time, Where: "kafka " + rec.Topic, Partition: &p, Offset: &o, Headers: rec.Headers,
		EventID: rec.Headers[event.HeaderEventID], EventType: rec.Headers[event.HeaderEventType]}
	if reason, dead := rec.Headers[inboxadmin.HeaderDLTReason]; dead {
		s.What = fmt.Sprintf("%s dead-lettered by %s at partition %d offset %d: %s", s.EventType,
			rec.Headers[inboxadmin.HeaderDLTConsumer], p, o, reason)
		s.State = "dead_lettered"
		r.add(s)
		return
	}
	s.RelayMode = relayMode(r.producedBy(rec.Topic), s.EventID)
	s.What = fmt.Sprintf("%s v%s at partition %d offset %d, published by the %s relay", s.EventType,
		rec.Headers[event.HeaderAggregateVersion], p, o, s.RelayMode)
	r.add(s)
}

// producedBy is the outbox rows of the service that publishes topic.
func (r *reader) producedBy(topic string) []outboxadmin.EventRecord {
	if topic == r.src.BillingTopic {
		return r.billingEvents
	}
	return r.ordersEvents
}

// relayMode tells which relay published an event from what its outbox row
// shows, since the records themselves do not say (consumers must not be
// able to tell): the polling relay marks its rows published, the log-based
// relay reading the table never updates them, and the WAL-only mode writes
// no row at all.
func relayMode(rows []outboxadmin.EventRecord, eventID string) string {
	for _, e := range rows {
		if e.EventID.String() != eventID {
			continue
		}
		if e.PublishedAt != nil || e.State == "published" {
			return string(outbox.ModePoll)
		}
		return string(outbox.ModeCDC)
	}
	return string(outbox.ModeWAL) + " (no outbox row; or a row already pruned)"
}

// settlement is the third party's booking, as GET /settlements/:key answers.
type settlement struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey"`
	Kind           string    `json:"kind"`
	AmountCents    int64     `json:"amountCents"`
	Currency       string    `json:"currency"`
	ReceivedAt     time.Time `json:"receivedAt"`
	TraceID        string    `json:"traceId"`
}

// ledger asks the third party about every billing event of the order: the
// shim books each under the event's id as its idempotency key.
func (r *reader) ledger(ctx context.Context) {
	var keys []string
	seen := map[string]bool{}
	key := func(id string) {
		if id != "" && !seen[id] {
			seen[id] = true
			keys = append(keys, id)
		}
	}
	for _, e := range r.billingEvents {
		key(e.EventID.String())
	}
	for _, rec := range r.records[r.src.BillingTopic] {
		key(rec.Headers[event.HeaderEventID])
	}
	for _, m := range r.shimInbox {
		key(m.MessageID.String())
	}
	for _, f := range r.forwards {
		key(f.eventID)
	}
	r.booked = map[string]int{}
	for _, k := range keys {
		got, err := r.settlements(ctx, k)
		if err != nil {
			r.j.Notes = append(r.j.Notes, fmt.Sprintf("the ledger not read: %v", err))
			r.booked = nil
			return
		}
		r.booked[k] = len(got)
		for i, s := range got {
			what := fmt.Sprintf("%s booked by the third party: settlement %s, %s", s.Kind, s.ID, money(s.AmountCents, s.Currency))
			if i > 0 {
				what = fmt.Sprintf("%s booked AGAIN by the third party (booking %d under one key): settlement %s", s.Kind, i+1, s.ID)
			}
			if s.TraceID != "" {
				what += ", trace " + s.TraceID
			}
			r.add(Step{At: s.ReceivedAt, Where: "ledger", What: what, EventID: k, State: s.Kind})
		}
	}
}

func (r *reader) settlements(ctx context.Context, key string) ([]settlement, error) {
	u := strings.TrimRight(r.src.LedgerURL, "/") + "/settlements/" + url.PathEscape(key)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := r.src.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return nil, nil
	case http.StatusOK:
		var out []settlement
		if err := json.Unmarshal(body, &out); err != nil {
			return nil, fmt.Errorf("GET %s: %w", u, err)
		}
		return out, nil
	}
	return nil, fmt.Errorf("GET %s: %s: %.200s", u, resp.Status, body)
}

// check lists what is missing or odd, each with what to run.
func (r *reader) check() {
	if r.j.Order == nil {
		r.problem("orders has no row for this order, yet other places know it (another database, or a row deleted by hand?)")
	}
	topicsRead := r.records != nil
	published := func(topic, id string) bool {
		for _, rec := range r.records[topic] {
			if rec.Headers[event.HeaderEventID] == id {
				return true
			}
		}
		return false
	}
	outboxes := []struct {
		service, topic, consumer string
		rows                     []outboxadmin.EventRecord
		consumed                 []inboxadmin.MessageRecord
	}{
		{"orders", r.src.OrdersTopic, "billing", r.ordersEvents, r.billingInbox},
		{"billing", r.src.BillingTopic, "reconciler-shim", r.billingEvents, r.shimInbox},
	}
	for _, o := range outboxes {
		for _, e := range o.rows {
			id := e.EventID.String()
			switch {
			case e.State == "dead":
				r.problem("%s v%d is dead in %s's outbox after %d attempts (%s): fix the cause, then "+
					"onceflowctl dead-letters requeue -service %s -kind outbox -event-ids %s", e.EventType, e.AggregateVersion, o.service,
					e.Attempts, e.LastError, o.service, id)
			case !topicsRead || published(o.topic, id) || hasMessage(o.consumed, id):
			case e.State == "pending":
				r.problem("%s v%d not yet published: pending in %s's outbox for %s (attempts %d%s); "+
					"onceflowctl status shows whether its relay is behind or Kafka is unreachable", e.EventType, e.AggregateVersion,
					o.service, r.now.Sub(e.CreatedAt).Round(time.Second), e.Attempts, lastError(e.LastError))
			default:
				r.problem("%s v%d is marked published in %s's outbox but is not in %s since the scan's start (retention, or a wider window: -scan-from)",
					e.EventType, e.AggregateVersion, o.service, o.topic)
			}
		}
		for _, rec := range r.records[o.topic] {
			id := rec.Headers[event.HeaderEventID]
			if hasMessage(o.consumed, id) || published(o.topic+".dlt", id) {
				continue
			}
			r.problem("%s at %s partition %d offset %d not yet consumed by %s: onceflowctl status shows its consumer lag",
				rec.Headers[event.HeaderEventType], o.topic, rec.Partition, rec.Offset, o.consumer)
		}
	}
	for _, in := range []struct {
		service string
		rows    []inboxadmin.MessageRecord
	}{{"billing", r.billingInbox}, {"reconciler-shim", r.shimInbox}} {
		for _, m := range in.rows {
			switch m.Status {
			case "dead_lettered":
				r.problem("%s v%d dead-lettered by %s after %d attempts (%s): fix the cause, then "+
					"onceflowctl dead-letters requeue -service %s -kind inbox -event-ids %s", m.EventType, m.AggregateVersion, m.Consumer,
					m.Attempts, m.LastError, in.service, m.MessageID)
			case "uncertain":
				r.problem("%s v%d uncertain in %s: the third party may or may not have booked it; "+
					"curl %s/settlements/%s, then follow docs/reconciliation.md#inbox_uncertain", m.EventType, m.AggregateVersion,
					m.Consumer, r.ledgerURL(), m.MessageID)
			case "leased":
				if m.LeaseUntil != nil && m.LeaseUntil.Before(r.now) {
					r.problem("%s v%d leased by %s, whose lease ran out %s ago: is %s running? (onceflowctl status)",
						m.EventType, m.AggregateVersion, m.LeaseOwner, r.now.Sub(*m.LeaseUntil).Round(time.Second), in.service)
				}
			case "parked":
				r.problem("%s v%d parked in %s behind an earlier dead version of this order: requeue that one "+
					"(onceflowctl dead-letters list -service %s)", m.EventType, m.AggregateVersion, m.Consumer, in.service)
			case "requeued":
				r.problem("%s v%d requeued for %s, its redelivery not applied yet: onceflowctl status shows the consumer lag; "+
					"if it never comes, onceflowctl parked release or skip (docs/reconciliation.md#inbox_parked)",
					m.EventType, m.AggregateVersion, m.Consumer)
			}
		}
	}
	for key, n := range r.booked {
		if n > 1 {
			r.problem("the third party booked idempotency key %s %d times: %d duplicate settlement(s) to reverse with the third party "+
				"(curl %s/settlements/%s; docs/reconciliation.md#duplicate_settlements)", key, n, n-1, r.ledgerURL(), key)
		}
	}
	if r.booked != nil {
		for _, f := range r.forwards {
			if r.booked[f.eventID] == 0 {
				r.problem("the shim recorded the %s as forwarded (%s) but the third party has nothing under key %s "+
					"(docs/reconciliation.md#charge_not_settled)", f.kind, f.outcome, f.eventID)
			}
		}
	}
}

func (r *reader) ledgerURL() string {
	if r.src.LedgerURL == "" {
		return "http://127.0.0.1:8084"
	}
	return strings.TrimRight(r.src.LedgerURL, "/")
}

func hasMessage(rows []inboxadmin.MessageRecord, id string) bool {
	for _, m := range rows {
		if m.MessageID.String() == id {
			return true
		}
	}
	return false
}

func lastError(s string) string {
	if s == "" {
		return ""
	}
	return ", last error: " + s
}
