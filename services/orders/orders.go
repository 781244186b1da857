package orders

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/platform/apperr"
)

// Order statuses.
const (
	StatusPlaced    = "placed"
	StatusCancelled = "cancelled"
)

// The events this service publishes, all on aggregate type "order".
const (
	AggregateType       = "order"
	EventOrderPlaced    = "OrderPlaced"
	EventOrderCancelled = "OrderCancelled"
)

// Order is one customer order.
type Order struct {
	ID          uuid.UUID `json:"id"`
	CustomerID  string    `json:"customerId"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	Status      string    `json:"status"`
	Version     int64     `json:"version"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
}

// OrderPlaced is the v1 payload of EventOrderPlaced: the integration
// contract, not the row.
type OrderPlaced struct {
	OrderID     uuid.UUID `json:"orderId"`
	CustomerID  string    `json:"customerId"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	PlacedAt    time.Time `json:"placedAt"`
}

// OrderCancelled is the v1 payload of EventOrderCancelled.
type OrderCancelled struct {
	OrderID     uuid.UUID `json:"orderId"`
	CancelledAt time.Time `json:"cancelledAt"`
}

// PlaceRequest is what a client sends to place an order.
type PlaceRequest struct {
	CustomerID  string `json:"customerId"`
	AmountCents int64  `json:"amountCents"`
	Currency    string `json:"currency"`
}

// MaxAmountCents caps one order, so a typo cannot charge a fortune.
const MaxAmountCents = 10_000_000_00

var customerIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// Currencies are the ISO 4217 codes the platform accepts.
var Currencies = map[string]bool{
	"AUD": true, "BRL": true, "CAD": true, "CHF": true, "CNY": true, "CZK": true, "DKK": true,
	"EUR": true, "GBP": true, "HKD": true, "INR": true, "JPY": true, "MXN": true, "NOK": true,
	"NZD": true, "PLN": true, "SEK": true, "SGD": true, "USD": true, "ZAR": true,
}

// Validate reports the first rule r breaks as an apperr.Invalid.
func (r PlaceRequest) Validate() error {
	switch {
	case !customerIDPattern.MatchString(r.CustomerID):
		return apperr.Errorf(apperr.Invalid, "customerId must be 1-64 letters, digits or ._:-")
	case r.AmountCents <= 0:
		return apperr.Errorf(apperr.Invalid, "amountCents must be a positive integer, got %d", r.AmountCents)
	case r.AmountCents > MaxAmountCents:
		return apperr.Errorf(apperr.Invalid, "amountCents must be at most %d, got %d", int64(MaxAmountCents), r.AmountCents)
	case !Currencies[r.Currency]:
		return apperr.Errorf(apperr.Invalid, "currency %s is not a supported ISO 4217 code", apperr.Quote(r.Currency))
	}
	return nil
}

// Meta is the request context an event records: who asked, and within what.
type Meta struct {
	CorrelationID string // the request id
	CausationID   string // the idempotency key or request id that caused the change
	Traceparent   string // W3C trace context of the request, if any
}

// CrashAfterWrite is the crash point between an order's business write and
// the moment its event is durable: before the transaction that holds the
// order and its outbox row commits (outbox mode: both vanish), or, in the
// naive mode, after the order committed and before its event is produced
// (the event is lost). Options.CrashPoint receives it.
const CrashAfterWrite = "orders.after-write"

// Publisher produces messages straight to the broker; *kafka.Writer
// satisfies it. Only the naive mode uses one.
type Publisher interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Options are the service's optional settings; the zero value is production.
type Options struct {
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// CrashPoint, when set, is called at CrashAfterWrite; see
	// crash.Point. Fault-injection harnesses use it; leave it nil otherwise.
	CrashPoint func(name string) error
	// NaivePublisher switches the service to the naive dual write, for the
	// fault-injection harness only: the order commits without an outbox
	// row, then its event is produced to NaiveTopic directly. A crash or a
	// broker error in between loses the event for good, which is what the
	// harness shows. Leave it nil.
	NaivePublisher Publisher
	// NaiveTopic is the topic NaivePublisher produces to.
	NaiveTopic string
	// WriteEvent writes an order's event in its transaction: outbox.Enqueue
	// (the default; RELAY_MODE poll and cdc) or cdc.Emit (wal), as
	// cdc.Write picks.
	WriteEvent cdc.WriteFunc
	// QueueEvent queues a new order's event onto the pipeline that writes
	// the order (Store.PlaceInPipeline), as cdc.Queue picks:
	// outbox.Queue, the default when WriteEvent is nil too. When it is nil
	// and WriteEvent is not (wal), orders are placed statement by statement
	// with WriteEvent.
	QueueEvent cdc.QueueFunc
}

// Service places, reads and cancels orders; its Store runs the SQL.
type Service struct {
	store   *Store
	now     func() time.Time
	opts    Options
	metrics *Metrics
}

// New returns a service on pool with opts.
func New(pool *pgxpool.Pool, opts Options) *Service {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Service{store: NewStore(pool), now: opts.Now, opts: opts, metrics: NewMetrics(nil)}
}

// Place writes a new order and its OrderPlaced event in one transaction.
// With an idempotency key, a repeat of the same request returns the
// original order and replayed=true; the same key with another request is a
// conflict.
func (s *Service) Place(ctx context.Context, req PlaceRequest, idempotencyKey string, meta Meta) (o Order, replayed bool, err error) {
	if err := req.Validate(); err != nil {
		return Order{}, false, err
	}
	// The key is stored as text: what Postgres would refuse is the caller's
	// mistake (400), not a 500.
	if err := apperr.CheckText("the Idempotency-Key header", idempotencyKey); err != nil {
		return Order{}, false, err
	}
	reqHash := requestHash(req)
	// The order and its event, as of now: called once the transaction is
	// about to run.
	newOrder := func() (Order, OrderPlaced) {
		now := s.now().UTC()
		o := Order{ID: event.NewID(), CustomerID: req.CustomerID, AmountCents: req.AmountCents, Currency: req.Currency,
			Status: StatusPlaced, Version: 1, CreatedAt: now, UpdatedAt: now}
		return o, OrderPlaced{OrderID: o.ID, CustomerID: o.CustomerID, AmountCents: o.AmountCents, Currency: o.Currency, PlacedAt: now}
	}
	if queue := s.queue(); queue != nil {
		o, err = s.store.PlaceInPipeline(ctx, idempotencyKey, reqHash, func() (Order, func(*pgx.Batch) error, error) {
			o, placed := newOrder()
			ev, err := s.envelope(o, EventOrderPlaced, placed, meta)
			return o, func(b *pgx.Batch) error { return queue(b, ev) }, err
		}, s.crashPoint)
	} else {
		var naive []event.Envelope
		err = s.inTx(ctx, &naive, func(tx pgx.Tx) error {
			var placed OrderPlaced
			o, placed = newOrder()
			if err := s.store.InsertOrder(ctx, tx, o); err != nil {
				return err
			}
			if idempotencyKey != "" {
				if err := s.store.InsertIdempotencyKey(ctx, tx, idempotencyKey, reqHash, o.ID); err != nil {
					return err
				}
			}
			return s.emit(ctx, tx, &naive, o, EventOrderPlaced, placed, meta)
		})
	}
	switch {
	case errors.Is(err, ErrDuplicate):
		// The key was used before: the transaction rolled back, and the
		// request is answered from what the key recorded.
		o, err = s.replay(ctx, idempotencyKey, reqHash)
		return o, err == nil, err
	case errors.Is(err, ErrInvalidData):
		// Validation let through a value Postgres refuses: still the
		// request's fault, and retrying it cannot help.
		return Order{}, false, fmt.Errorf("placing order: %w: %w",
			apperr.Errorf(apperr.Invalid, "the order has a value the database refuses"), err)
	case err != nil:
		return Order{}, false, fmt.Errorf("placing order: %w", err)
	}
	s.metrics.placed.Inc()
	return o, false, nil
}

func (s *Service) replay(ctx context.Context, key string, reqHash []byte) (Order, error) {
	stored, id, err := s.store.IdempotencyKey(ctx, key)
	if err != nil {
		// ErrNotFound cannot happen: keys are never deleted.
		return Order{}, fmt.Errorf("replaying idempotency key: %w", err)
	}
	if string(stored) != string(reqHash) {
		return Order{}, apperr.Errorf(apperr.Conflict, "Idempotency-Key %s was already used with a different request", apperr.Quote(key))
	}
	return s.Get(ctx, id)
}

// Get returns one order; a missing one is an apperr.NotFound.
func (s *Service) Get(ctx context.Context, id uuid.UUID) (Order, error) {
	o, err := s.store.Order(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return Order{}, notFound(id)
	}
	return o, err
}

func notFound(id uuid.UUID) error {
	return apperr.Errorf(apperr.NotFound, "order %s does not exist", id)
}

// Cancel cancels a placed order and emits OrderCancelled in the same
// transaction. Cancelling a cancelled order changes nothing and emits nothing.
func (s *Service) Cancel(ctx context.Context, id uuid.UUID, meta Meta) (Order, error) {
	var (
		o       Order
		changed bool
		naive   []event.Envelope
	)
	err := s.inTx(ctx, &naive, func(tx pgx.Tx) error {
		var err error
		o, err = s.store.LockOrder(ctx, tx, id)
		if errors.Is(err, ErrNotFound) {
			return notFound(id)
		}
		if err != nil || o.Status == StatusCancelled {
			return err
		}
		now := s.now().UTC()
		o.Status, o.Version, o.UpdatedAt = StatusCancelled, o.Version+1, now
		if err := s.store.UpdateOrder(ctx, tx, o); err != nil {
			return err
		}
		changed = true
		return s.emit(ctx, tx, &naive, o, EventOrderCancelled, OrderCancelled{OrderID: o.ID, CancelledAt: now}, meta)
	})
	if err != nil {
		return Order{}, fmt.Errorf("cancelling order: %w", err)
	}
	if changed {
		s.metrics.cancelled.Inc()
	}
	return o, nil
}

// inTx runs fn in a transaction and passes the crash point between the
// business write and the point where its events are durable. In the naive
// mode, fn leaves the events in *naive instead of the outbox, and they are
// produced after the commit: the dual write the outbox exists to avoid.
func (s *Service) inTx(ctx context.Context, naive *[]event.Envelope, fn func(tx pgx.Tx) error) error {
	err := s.store.InTx(ctx, func(tx pgx.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		if s.opts.NaivePublisher == nil {
			return s.crashPoint()
		}
		return nil
	})
	if err != nil || len(*naive) == 0 {
		return err
	}
	if err := s.crashPoint(); err != nil {
		return err
	}
	msgs := make([]kafka.Message, 0, len(*naive))
	for _, ev := range *naive {
		msgs = append(msgs, event.ToKafka(s.opts.NaiveTopic, ev))
	}
	if err := s.opts.NaivePublisher.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("publishing after commit (naive mode; the event is lost): %w", err)
	}
	return nil
}

func (s *Service) crashPoint() error {
	if s.opts.CrashPoint == nil {
		return nil
	}
	if err := s.opts.CrashPoint(CrashAfterWrite); err != nil {
		return fmt.Errorf("crash point %s: %w", CrashAfterWrite, err)
	}
	return nil
}

// queue is how Place writes an order's event in its pipeline, or nil when
// it runs its transaction statement by statement (the naive mode, and an
// event write that cannot be queued: see Options.QueueEvent).
func (s *Service) queue() cdc.QueueFunc {
	switch {
	case s.opts.NaivePublisher != nil:
		return nil
	case s.opts.QueueEvent != nil:
		return s.opts.QueueEvent
	case s.opts.WriteEvent == nil:
		return outbox.Queue
	}
	return nil
}

// envelope is the event for o's current version.
func (s *Service) envelope(o Order, eventType string, payload any, meta Meta) (event.Envelope, error) {
	body, err := json.Marshal(payload)
	if err != nil {
		return event.Envelope{}, fmt.Errorf("encoding %s: %w", eventType, err)
	}
	return event.Envelope{
		EventID:          event.NewID(),
		EventType:        eventType,
		EventVersion:     1,
		AggregateType:    AggregateType,
		AggregateID:      o.ID.String(),
		AggregateVersion: o.Version,
		OccurredAt:       o.UpdatedAt,
		CorrelationID:    meta.CorrelationID,
		CausationID:      meta.CausationID,
		Traceparent:      meta.Traceparent,
		Payload:          body,
	}, nil
}

// emit writes the event for o's current version to the outbox in tx (or,
// in the naive mode, to *naive for inTx to produce after the commit).
func (s *Service) emit(ctx context.Context, tx pgx.Tx, naive *[]event.Envelope, o Order, eventType string, payload any, meta Meta) error {
	ev, err := s.envelope(o, eventType, payload, meta)
	if err != nil {
		return err
	}
	if s.opts.NaivePublisher != nil {
		*naive = append(*naive, ev)
		return nil
	}
	if s.opts.WriteEvent != nil {
		return s.opts.WriteEvent(ctx, tx, ev)
	}
	return outbox.Enqueue(ctx, tx, ev)
}

func requestHash(r PlaceRequest) []byte {
	b, _ := json.Marshal(r) // a struct of strings and ints always encodes
	h := sha256.Sum256(b)
	return h[:]
}
