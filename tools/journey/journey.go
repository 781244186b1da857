package journey

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
)

// ErrNotFound: no database, topic or ledger knows the order.
var ErrNotFound = errors.New("no trace of this order anywhere")

// Sources are what Follow reads. The databases are read-only handles.
type Sources struct {
	Orders, Billing, Shim outboxadmin.BacklogDB
	// Brokers are Kafka's bootstrap addresses; empty skips the topics.
	Brokers []string
	// OrdersTopic and BillingTopic default to orders.events and
	// billing.events; their dead-letter topics are the names + ".dlt".
	OrdersTopic, BillingTopic string
	// LedgerURL is the third party's base URL; empty skips the ledger.
	LedgerURL string
	// HTTP calls the ledger; nil uses a client with a 10 s timeout.
	HTTP *http.Client
	// ScanFrom is how long before the order's creation the topics are read
	// from (records carry the producer's clock). Default 1m.
	ScanFrom time.Duration
	// MaxScan bounds the records read per topic, so a journey on a busy
	// topic ends. Default 200,000.
	MaxScan int
}

// Order is the order's row in the orders database.
type Order struct {
	ID          string    `json:"id"`
	Status      string    `json:"status"`
	CustomerID  string    `json:"customerId"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	Version     int64     `json:"version"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
}

// Step is one thing that happened to the order, somewhere.
type Step struct {
	At time.Time `json:"at"`
	// Hop is how long after the step that led to it this one happened
	// (HopFrom says which); zero for the first.
	Hop     time.Duration `json:"hopNs"`
	HopFrom string        `json:"hopFrom,omitempty"`
	// Where is the database, topic or third party: "orders db",
	// "kafka orders.events", "ledger", ...
	Where string `json:"where"`
	// What says what happened, in words.
	What      string `json:"what"`
	EventID   string `json:"eventId,omitempty"`
	EventType string `json:"eventType,omitempty"`
	// Kafka records only.
	Partition *int              `json:"partition,omitempty"`
	Offset    *int64            `json:"offset,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	// RelayMode is the relay that published a record, as the outbox row
	// shows it: poll (row marked published), cdc (row never updated) or
	// wal (no row).
	RelayMode string `json:"relayMode,omitempty"`
	// State is the row's state or status where it has one.
	State string `json:"state,omitempty"`

	// cause is the event this step's event was caused by (outbox rows).
	cause string
	// notAHop: later steps do not count their hop from this one (the
	// polling relay's "marked published" comes after the broker's ack, but
	// a record's hop is its publish latency from the row's commit).
	notAHop bool
}

// Journey is everything Follow found about one order.
type Journey struct {
	OrderID string `json:"orderId"`
	// Order is nil when the orders database has no such row.
	Order *Order `json:"order,omitempty"`
	// Steps in time order.
	Steps []Step `json:"steps"`
	// Problems are what is missing or odd, each with what to run; empty
	// when the order went through cleanly.
	Problems []string `json:"problems"`
	// Notes are limits of this read (a topic not read, a scan cut short).
	Notes []string `json:"notes,omitempty"`
}

func (s *Sources) withDefaults() {
	if s.OrdersTopic == "" {
		s.OrdersTopic = "orders.events"
	}
	if s.BillingTopic == "" {
		s.BillingTopic = "billing.events"
	}
	if s.HTTP == nil {
		s.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	if s.ScanFrom == 0 {
		s.ScanFrom = time.Minute
	}
	if s.MaxScan == 0 {
		s.MaxScan = 200_000
	}
}

// Follow reads every source for orderID and returns its journey. It fails
// when a database cannot be read (a partial journey would hide steps); a
// topic or a ledger that cannot be read is a note instead, since a journey
// of the databases alone still helps.
func Follow(ctx context.Context, src Sources, orderID string) (Journey, error) {
	src.withDefaults()
	if _, err := uuid.Parse(orderID); err != nil {
		return Journey{}, fmt.Errorf("order id %q is not a UUID: %w", orderID, err)
	}
	j := Journey{OrderID: orderID, Problems: []string{}}
	r := &reader{src: src, j: &j, now: time.Now()}
	if err := r.databases(ctx); err != nil {
		return Journey{}, err
	}
	if len(src.Brokers) > 0 {
		r.topics(ctx)
	} else {
		j.Notes = append(j.Notes, "topics not read (no brokers given)")
	}
	if src.LedgerURL != "" {
		r.ledger(ctx)
	} else {
		j.Notes = append(j.Notes, "the third party's ledger not read (no URL given)")
	}
	if j.Order == nil && len(j.Steps) == 0 {
		return Journey{}, fmt.Errorf("order %s: %w", orderID, ErrNotFound)
	}
	r.check()
	sort.SliceStable(j.Steps, func(a, b int) bool { return j.Steps[a].At.Before(j.Steps[b].At) })
	hops(j.Steps)
	return j, nil
}

// reader holds what Follow read so far, for the checks.
type reader struct {
	src Sources
	j   *Journey
	now time.Time

	ordersEvents, billingEvents []outboxadmin.EventRecord
	billingInbox, shimInbox     []inboxadmin.MessageRecord
	forwards                    []forward
	records                     map[string][]record // by topic
	charge                      *charge
	// booked is how many times the ledger booked each idempotency key
	// (event id) it was asked about.
	booked map[string]int
}

func (r *reader) add(s Step) { r.j.Steps = append(r.j.Steps, s) }

func (r *reader) problem(format string, args ...any) {
	r.j.Problems = append(r.j.Problems, fmt.Sprintf(format, args...))
}

// hops sets each step's Hop from the step that led to it: the previous step
// of the same event; for an event's first step, the last step of the event
// that caused it, or else the previous step in the same place (an outbox
// row follows its domain change).
func hops(steps []Step) {
	for i := range steps {
		s := &steps[i]
		from := -1
		for k := i - 1; k >= 0 && from < 0; k-- {
			if s.EventID != "" && steps[k].EventID == s.EventID && !steps[k].notAHop {
				from = k
			}
		}
		for k := i - 1; k >= 0 && from < 0; k-- {
			if s.cause != "" && steps[k].EventID == s.cause {
				from = k
			}
		}
		for k := i - 1; k >= 0 && from < 0; k-- {
			if steps[k].Where == s.Where {
				from = k
			}
		}
		if from < 0 {
			continue
		}
		s.Hop = s.At.Sub(steps[from].At)
		s.HopFrom = steps[from].What
	}
}
