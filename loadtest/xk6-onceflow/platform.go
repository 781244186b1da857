package onceflow

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
)

// Backlog is the number of outbox rows waiting for each relay.
type Backlog struct {
	Orders  int `js:"orders"`
	Billing int `js:"billing"`
}

// pendingQuery reads the outbox's partial index of pending rows.
const pendingQuery = `SELECT count(*) FROM outbox_events WHERE state = 'pending'`

// Backlog counts the pending outbox rows of orders and billing.
func (c *Client) Backlog() (Backlog, error) {
	var b Backlog
	if err := c.shared.orders.QueryRow(c.ctx(), pendingQuery).Scan(&b.Orders); err != nil {
		return b, fmt.Errorf("onceflow.backlog: orders: %w", err)
	}
	if err := c.shared.bill.QueryRow(c.ctx(), pendingQuery).Scan(&b.Billing); err != nil {
		return b, fmt.Errorf("onceflow.backlog: billing: %w", err)
	}
	return b, nil
}

// Counts are the ledgers' sizes: every row, not only this run's.
type Counts struct {
	Orders   int `js:"orders"`   // orders rows
	Charges  int `js:"charges"`  // billing's charges rows
	Forwards int `js:"forwards"` // payments the shim forwarded to the third party
}

// Counts reads the three ledgers' row counts.
func (c *Client) Counts() (Counts, error) {
	var n Counts
	for _, q := range []struct {
		db   *pgxpool.Pool
		sql  string
		into *int
	}{
		{c.shared.orders, `SELECT count(*) FROM orders`, &n.Orders},
		{c.shared.bill, `SELECT count(*) FROM charges`, &n.Charges},
		{c.shared.shim, `SELECT count(*) FROM forwards`, &n.Forwards},
	} {
		if err := q.db.QueryRow(c.ctx(), q.sql).Scan(q.into); err != nil {
			return n, fmt.Errorf("onceflow.counts: %w", err)
		}
	}
	return n, nil
}

// Duplicate publishes again up to n of the most recently published
// OrderPlaced events, with their original event ids, as a relay that
// crashed between the broker's ack and its mark would. Billing must count
// them as duplicates and charge nothing twice. It returns how many it sent.
func (c *Client) Duplicate(n int) (int, error) {
	w, err := c.writer("duplicate")
	if err != nil {
		return 0, err
	}
	rows, err := c.shared.orders.Query(c.ctx(), `
		SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
		       payload, occurred_at
		FROM outbox_events
		WHERE state = 'published' AND event_type = 'OrderPlaced'
		ORDER BY id DESC LIMIT $1`, n)
	if err != nil {
		return 0, fmt.Errorf("onceflow.duplicate: %w", err)
	}
	msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kafka.Message, error) {
		var e event.Envelope
		err := r.Scan(&e.EventID, &e.AggregateType, &e.AggregateID, &e.AggregateVersion, &e.EventType,
			&e.EventVersion, &e.Payload, &e.OccurredAt)
		return event.ToKafka(c.shared.cfg.OrdersTopic, e), err
	})
	if err != nil {
		return 0, fmt.Errorf("onceflow.duplicate: %w", err)
	}
	if err := w.WriteMessages(c.ctx(), msgs...); err != nil {
		return 0, fmt.Errorf("onceflow.duplicate: %w", err)
	}
	return len(msgs), nil
}

// Poison publishes n messages no consumer can decode (a key and a body, no
// envelope headers). Billing must dead-letter each one and keep consuming.
func (c *Client) Poison(n int) (int, error) {
	w, err := c.writer("poison")
	if err != nil {
		return 0, err
	}
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{
			Topic: c.shared.cfg.OrdersTopic,
			Key:   []byte(uuid.NewString()),
			Value: []byte(`{"this is":"not an event"}`),
			Time:  time.Now(),
		}
	}
	if err := w.WriteMessages(c.ctx(), msgs...); err != nil {
		return 0, fmt.Errorf("onceflow.poison: %w", err)
	}
	return n, nil
}

// Produce publishes one raw message: for scenarios that need a message of
// their own making. headers may be null.
func (c *Client) Produce(topic, key, value string, headers map[string]string) error {
	w, err := c.writer("produce")
	if err != nil {
		return err
	}
	m := kafka.Message{Topic: topic, Key: []byte(key), Value: []byte(value)}
	for k, v := range headers {
		m.Headers = append(m.Headers, kafka.Header{Key: k, Value: []byte(v)})
	}
	if err := w.WriteMessages(c.ctx(), m); err != nil {
		return fmt.Errorf("onceflow.produce: %w", err)
	}
	return nil
}

func (c *Client) writer(fn string) (*kafka.Writer, error) {
	if c.shared.writer == nil || c.shared.cfg.OrdersTopic == "" && fn != "produce" {
		return nil, fmt.Errorf("onceflow.%s: connect with brokers and ordersTopic first", fn)
	}
	return c.shared.writer, nil
}
