package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
)

// The kinds of finding. Each has a runbook line in Runbooks.
const (
	// KindOutboxStuck: outbox rows still pending after Config.OutboxStuckAfter.
	KindOutboxStuck = "outbox_stuck"
	// KindOutboxDead: outbox rows the relay gave up on; they block their
	// aggregate's later events.
	KindOutboxDead = "outbox_dead"
	// KindInboxLeaseExpired: inbox messages whose lease ran out more than
	// Config.LeaseGrace ago and were not taken over.
	KindInboxLeaseExpired = "inbox_lease_expired"
	// KindInboxUncertain: side effects whose outcome the consumer could not
	// learn (the shim's forwards to the third party); a person decides.
	KindInboxUncertain = "inbox_uncertain"
	// KindDeadLetterOverdue: inbox dead letters older than Config.DeadLetterSLA.
	KindDeadLetterOverdue = "dead_letter_overdue"
	// KindInboxParked: inbox events parked behind a dead event of their
	// aggregate, waiting for its requeue; any age.
	KindInboxParked = "inbox_parked"
	// KindOrderWithoutCharge: orders older than Config.ChargeAfter that
	// billing has not charged.
	KindOrderWithoutCharge = "order_without_charge"
	// KindChargeNotForwarded: charges older than Config.SettleAfter that the
	// shim has not forwarded to the third party.
	KindChargeNotForwarded = "charge_not_forwarded"
	// KindChargeNotSettled: charges the shim recorded as forwarded that the
	// third party's ledger does not have.
	KindChargeNotSettled = "charge_not_settled"
)

// Runbooks is the line an operator reads for each kind; docs/reconciliation.md
// has the full text.
var Runbooks = map[string]string{
	KindOutboxStuck:        "Check the relay: `onceflowctl status` (is the service up, its Kafka connected, the oldest pending age growing?). Fix the outage; the rows go out by themselves.",
	KindOutboxDead:         "Read the error: `onceflowctl dead-letters list -service <component>`; fix the cause, then `onceflowctl dead-letters requeue -service <component> -kind outbox -event-ids <event id>`. Later events of the aggregate wait until then.",
	KindInboxLeaseExpired:  "The worker holding the lease died and no consumer took the message over: `onceflowctl status` (consumer up and connected? its lag?); restart the consumer to reclaim the lease.",
	KindInboxUncertain:     "The samples are event ids, the third party's idempotency keys: `curl http://127.0.0.1:8084/settlements/<event id>` (200 booked, 404 not) and follow docs/reconciliation.md#inbox_uncertain: the one documented exception where a person settles the row.",
	KindDeadLetterOverdue:  "Read the error: `onceflowctl dead-letters list -service <component>`; fix the cause, then `onceflowctl dead-letters requeue -service <component> -kind inbox -event-ids <event id>` (or record why it is dropped).",
	KindInboxParked:        "The samples are event ids of parked events: `onceflowctl parked -service <component>` names the dead event each waits for (WAITS FOR); fix its cause and `onceflowctl dead-letters requeue -service <component> -kind inbox -event-ids <that event id>`; the parked ones follow it in order by themselves. A dead event that cannot be requeued: docs/reconciliation.md#inbox_parked (parked release or skip, with a reason).",
	KindOrderWithoutCharge: "The samples are order ids: `onceflowctl journey <order id>` shows where its OrderPlaced stopped (pending, dead, dead-lettered) and the command that moves it on.",
	KindChargeNotForwarded: "The samples are order ids: `onceflowctl journey <order id>` shows where its PaymentCaptured stopped (billing's outbox, the shim's dead letters or uncertain rows) and the command that moves it on.",
	KindChargeNotSettled:   "The samples are order ids: `onceflowctl journey <order id>` shows the forward and asks the third party under the right key (the event id); then docs/reconciliation.md#charge_not_settled.",
}

// Config holds the thresholds. A zero field takes its default.
type Config struct {
	// OutboxStuckAfter is how long a pending outbox row may wait. Default 5m.
	OutboxStuckAfter time.Duration
	// LeaseGrace is how long past its lease_until a leased inbox row may stay
	// unclaimed. Default 1m.
	LeaseGrace time.Duration
	// DeadLetterSLA is how long an inbox dead letter may wait for a person.
	// Default 1h.
	DeadLetterSLA time.Duration
	// ChargeAfter is how long after an order its charge must exist. Default 10m.
	ChargeAfter time.Duration
	// SettleAfter is how long after a charge its settlement must exist.
	// Default 10m.
	SettleAfter time.Duration
	// Lookback bounds the cross-database checks to orders and charges younger
	// than this, so a run reads a bounded window. Default 168h.
	Lookback time.Duration
	// Samples is how many ids each finding lists. Default 5.
	Samples int
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.OutboxStuckAfter, 5*time.Minute)
	def(&c.LeaseGrace, time.Minute)
	def(&c.DeadLetterSLA, time.Hour)
	def(&c.ChargeAfter, 10*time.Minute)
	def(&c.SettleAfter, 10*time.Minute)
	def(&c.Lookback, 168*time.Hour)
	if c.Samples == 0 {
		c.Samples = 5
	}
	return c
}

// Sources are the databases and the ledger to reconcile.
type Sources struct {
	Orders, Billing, Shim Querier
	// LedgerURL is the third-party reconciler's base URL (GET /settlements).
	// Empty skips KindChargeNotSettled.
	LedgerURL string
	// HTTP calls the ledger; nil uses a client with a 30 s timeout.
	HTTP *http.Client
}

// Finding is one kind of inconsistency in one component's data.
type Finding struct {
	Kind string `json:"kind"`
	// Component is the service (or the third party, "reconciler") whose
	// data has the inconsistency or that should act on it.
	Component string `json:"component"`
	Count     int    `json:"count"`
	// Oldest is when the oldest one began (created, received, placed).
	Oldest    time.Time     `json:"oldest,omitzero"`
	OldestAge time.Duration `json:"oldestAgeNs"`
	// Samples are ids of the oldest ones (event, message, order ids).
	Samples []string `json:"samples,omitempty"`
	Runbook string   `json:"runbook"`
}

// Report is the result of one Run: every check, the clean ones with Count 0.
type Report struct {
	At       time.Time `json:"at"`
	Findings []Finding `json:"findings"`
}

// Problems returns the findings with a non-zero count.
func (r Report) Problems() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Count > 0 {
			out = append(out, f)
		}
	}
	return out
}

// Run checks every source and returns the report. It fails on the first
// source it cannot read: a partial report would read as "clean".
func Run(ctx context.Context, src Sources, cfg Config) (Report, error) {
	cfg = cfg.WithDefaults()
	rep := Report{At: time.Now()}
	add := func(f Finding, err error) error {
		if err != nil {
			return fmt.Errorf("%s in %s: %w", f.Kind, f.Component, err)
		}
		f.Runbook = Runbooks[f.Kind]
		if f.Count > 0 {
			f.OldestAge = rep.At.Sub(f.Oldest).Round(time.Second)
		}
		rep.Findings = append(rep.Findings, f)
		return nil
	}
	for _, s := range []struct {
		name string
		db   Querier
	}{{"orders", src.Orders}, {"billing", src.Billing}} {
		b, err := outboxadmin.Backlog(ctx, s.db, outboxadmin.BacklogConfig{PendingOlderThan: cfg.OutboxStuckAfter, Samples: cfg.Samples})
		err = translate("reading the outbox's backlog", err)
		for _, f := range []Finding{
			backlogFinding(KindOutboxStuck, s.name, b.Pending.Count, b.Pending.Oldest, b.Pending.Samples),
			backlogFinding(KindOutboxDead, s.name, b.Dead.Count, b.Dead.Oldest, b.Dead.Samples),
		} {
			if err := add(f, err); err != nil {
				return Report{}, err
			}
		}
	}
	for _, s := range []struct {
		name string
		db   Querier
	}{{"billing", src.Billing}, {"reconciler-shim", src.Shim}} {
		b, err := inboxadmin.Backlog(ctx, s.db, inboxadmin.BacklogConfig{
			LeaseExpiredFor: cfg.LeaseGrace, DeadLetteredOlderThan: cfg.DeadLetterSLA, Samples: cfg.Samples})
		err = translate("reading the inbox's backlog", err)
		for _, f := range []Finding{
			backlogFinding(KindInboxLeaseExpired, s.name, b.LeaseExpired.Count, b.LeaseExpired.Oldest, b.LeaseExpired.Samples),
			backlogFinding(KindInboxUncertain, s.name, b.Uncertain.Count, b.Uncertain.Oldest, b.Uncertain.Samples),
			backlogFinding(KindDeadLetterOverdue, s.name, b.DeadLettered.Count, b.DeadLettered.Oldest, b.DeadLettered.Samples),
			backlogFinding(KindInboxParked, s.name, b.Parked.Count, b.Parked.Oldest, b.Parked.Samples),
		} {
			if err := add(f, err); err != nil {
				return Report{}, err
			}
		}
	}
	noCharge, err := missing(ctx, src.Orders, sqlOrdersInWindow,
		[]any{cfg.ChargeAfter.Microseconds(), cfg.Lookback.Microseconds()},
		present(src.Billing, sqlChargesOfOrders), cfg.Samples)
	if err := add(Finding{Kind: KindOrderWithoutCharge, Component: "billing", Count: noCharge.count, Oldest: noCharge.oldest, Samples: noCharge.samples}, err); err != nil {
		return Report{}, err
	}
	charges := sqlChargesInWindow
	chargeArgs := []any{cfg.SettleAfter.Microseconds(), cfg.Lookback.Microseconds()}
	forwarded := present(src.Shim, sqlCaptureForwardsOfOrders)
	notForwarded, err := missing(ctx, src.Billing, charges, chargeArgs, forwarded, cfg.Samples)
	if err := add(Finding{Kind: KindChargeNotForwarded, Component: "reconciler-shim", Count: notForwarded.count, Oldest: notForwarded.oldest, Samples: notForwarded.samples}, err); err != nil {
		return Report{}, err
	}
	if src.LedgerURL != "" {
		booked, err := ledgerCaptures(ctx, src)
		if err != nil {
			return Report{}, fmt.Errorf("%s: %w", KindChargeNotSettled, err)
		}
		// Of the forwarded charges, those the ledger lacks; the unforwarded
		// ones are already reported above.
		settled := func(ctx context.Context, ids []string) (map[string]bool, error) {
			fw, err := forwarded(ctx, ids)
			if err != nil {
				return nil, err
			}
			out := map[string]bool{}
			for _, id := range ids {
				if !fw[id] || booked[id] {
					out[id] = true
				}
			}
			return out, nil
		}
		notSettled, err := missing(ctx, src.Billing, charges, chargeArgs, settled, cfg.Samples)
		if err := add(Finding{Kind: KindChargeNotSettled, Component: "reconciler", Count: notSettled.count, Oldest: notSettled.oldest, Samples: notSettled.samples}, err); err != nil {
			return Report{}, err
		}
	}
	return rep, nil
}

type gap struct {
	count   int
	oldest  time.Time
	samples []string
}

// batchSize bounds the ids one lookup sends to the other database.
const batchSize = 1000

// missing streams (id, time) rows of query, oldest first, and counts those
// the lookup does not find, in batches so that neither side is read whole.
func missing(ctx context.Context, db Querier, query string, args []any, has lookup, samples int) (gap, error) {
	var g gap
	type row struct {
		id string
		at time.Time
	}
	var batch []row
	flush := func() error {
		ids := make([]string, len(batch))
		for i, r := range batch {
			ids[i] = r.id
		}
		found, err := has(ctx, ids)
		if err != nil {
			return err
		}
		for _, r := range batch {
			if found[r.id] {
				continue
			}
			if g.count == 0 {
				g.oldest = r.at
			}
			g.count++
			if len(g.samples) < samples {
				g.samples = append(g.samples, r.id)
			}
		}
		batch = batch[:0]
		return nil
	}
	// The lookups run on another database, so the rows can be buffered a
	// batch at a time while this cursor stays open.
	err := idsSince(ctx, db, query, args, func(id string, at time.Time) error {
		batch = append(batch, row{id, at})
		if len(batch) == batchSize {
			return flush()
		}
		return nil
	})
	if err != nil {
		return g, err
	}
	if len(batch) > 0 {
		if err := flush(); err != nil {
			return g, err
		}
	}
	return g, nil
}

// ledgerCaptures returns the order ids the third party booked a capture for.
func ledgerCaptures(ctx context.Context, src Sources) (map[string]bool, error) {
	hc := src.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(src.LedgerURL, "/")+"/settlements", nil)
	if err != nil {
		return nil, fmt.Errorf("building the ledger request: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("reading the ledger: %s: %s", resp.Status, body)
	}
	var all []struct {
		OrderID string `json:"orderId"`
		Kind    string `json:"kind"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&all); err != nil {
		return nil, fmt.Errorf("decoding the ledger: %w", err)
	}
	out := make(map[string]bool, len(all))
	for _, s := range all {
		if s.Kind == "capture" {
			out[s.OrderID] = true
		}
	}
	return out, nil
}
