// Package outboxtest is the outbox's test kit, for the tests of code that
// enqueues events (River's rivertest is the model): assert what a
// transaction enqueued without writing SQL against the outbox table, and an
// in-memory Writer that records what a relay publishes.
//
// The helpers read through anything with Query — the transaction under test
// (to see what it wrote before it commits), a pool or a connection.
package outboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// DB is what the helpers read the outbox through: a pgx.Tx, a
// *pgxpool.Pool or a *pgx.Conn.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Match selects outbox rows. Empty fields match anything.
type Match struct {
	EventType     string
	AggregateType string
	AggregateID   string
	// AggregateVersion matches one version; 0 matches any.
	AggregateVersion int64
	// State is "pending", "published" or "dead"; "" matches any.
	State string
}

// String describes m for failure messages, e.g. "event_type=OrderPlaced
// state=pending".
func (m Match) String() string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("event_type", m.EventType)
	add("aggregate_type", m.AggregateType)
	add("aggregate_id", m.AggregateID)
	if m.AggregateVersion != 0 {
		add("aggregate_version", fmt.Sprint(m.AggregateVersion))
	}
	add("state", m.State)
	if len(parts) == 0 {
		return "any event"
	}
	return strings.Join(parts, " ")
}

// Event is one outbox row: the envelope the relay publishes, and where the
// row stands.
type Event struct {
	event.Envelope
	// State is "pending", "published" or "dead".
	State string
	// Attempts is how many publishes of it failed because of the message.
	Attempts int
}

const selectEvents = `
SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
       payload, headers, occurred_at, state, attempts
FROM outbox_events
WHERE ($1 = '' OR event_type = $1)
  AND ($2 = '' OR aggregate_type = $2)
  AND ($3 = '' OR aggregate_id = $3)
  AND ($4 = 0 OR aggregate_version = $4)
  AND ($5 = '' OR state::text = $5)
ORDER BY id`

// Enqueued returns every outbox row m matches, in the order they were
// enqueued.
func Enqueued(t testing.TB, db DB, m Match) []Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := db.Query(ctx, selectEvents, m.EventType, m.AggregateType, m.AggregateID, m.AggregateVersion, m.State)
	if err != nil {
		t.Fatalf("outboxtest: reading the outbox: %v", err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var (
			e       Event
			id      [16]byte
			payload []byte
			headers []byte
		)
		err := r.Scan(&id, &e.AggregateType, &e.AggregateID, &e.AggregateVersion, &e.EventType, &e.EventVersion,
			&payload, &headers, &e.OccurredAt, &e.State, &e.Attempts)
		if err != nil {
			return e, err
		}
		e.EventID = uuid.UUID(id)
		e.Payload = json.RawMessage(payload)
		var h struct{ CorrelationID, CausationID, Traceparent string }
		if len(headers) > 0 {
			if err := json.Unmarshal(headers, &h); err != nil {
				return e, fmt.Errorf("decoding headers %s: %w", headers, err)
			}
		}
		e.CorrelationID, e.CausationID, e.Traceparent = h.CorrelationID, h.CausationID, h.Traceparent
		return e, nil
	})
	if err != nil {
		t.Fatalf("outboxtest: reading the outbox: %v", err)
	}
	return evs
}

// RequireEnqueued fails the test unless exactly one outbox row matches m,
// and returns it.
func RequireEnqueued(t testing.TB, db DB, m Match) Event {
	t.Helper()
	evs := Enqueued(t, db, m)
	if len(evs) != 1 {
		t.Fatalf("outboxtest: want 1 event enqueued matching %v, found %d%s", m, len(evs), describe(evs))
	}
	return evs[0]
}

// RequireManyEnqueued fails the test unless exactly n outbox rows match m,
// and returns them in the order they were enqueued.
func RequireManyEnqueued(t testing.TB, db DB, m Match, n int) []Event {
	t.Helper()
	evs := Enqueued(t, db, m)
	if len(evs) != n {
		t.Fatalf("outboxtest: want %d events enqueued matching %v, found %d%s", n, m, len(evs), describe(evs))
	}
	return evs
}

// RequireNotEnqueued fails the test if any outbox row matches m.
func RequireNotEnqueued(t testing.TB, db DB, m Match) {
	t.Helper()
	if evs := Enqueued(t, db, m); len(evs) != 0 {
		t.Fatalf("outboxtest: want no event enqueued matching %v, found %d%s", m, len(evs), describe(evs))
	}
}

func describe(evs []Event) string {
	var b strings.Builder
	for i, e := range evs {
		if i == 5 {
			fmt.Fprintf(&b, "\n\t…")
			break
		}
		fmt.Fprintf(&b, "\n\t%s %s/%s v%d (%s)", e.EventType, e.AggregateType, e.AggregateID, e.AggregateVersion, e.State)
	}
	return b.String()
}

// Writer is an in-memory outbox.Writer (and inbox.Writer) that records every
// message written to it, for a relay or a consumer's dead letters under
// test. The zero value is ready to use and safe for concurrent use.
type Writer struct {
	// Fail, when set, is asked about each write; a non-nil error fails the
	// write as Kafka would and nothing of it is recorded.
	Fail func(msgs []kafka.Message) error

	rec testenv.Recorder
}

// WriteMessages records msgs, or returns what Fail says.
func (w *Writer) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if w.Fail != nil {
		if err := w.Fail(msgs); err != nil {
			return err
		}
	}
	return w.rec.WriteMessages(ctx, msgs...)
}

// Messages returns a copy of what was written so far, in order.
func (w *Writer) Messages() []kafka.Message { return w.rec.Messages() }

// Events decodes what was written so far, failing the test on a message
// that is not an event.
func (w *Writer) Events(t testing.TB) []event.Envelope {
	t.Helper()
	var evs []event.Envelope
	for _, m := range w.Messages() {
		e, err := event.FromKafka(m)
		if err != nil {
			t.Fatalf("outboxtest: message at %s is not an event: %v", m.Topic, err)
		}
		evs = append(evs, e)
	}
	return evs
}
