package outboxtest

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// SeedDB is what Seed writes through: a pgx.Tx, a *pgxpool.Pool or a
// *pgx.Conn.
type SeedDB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Row is an outbox row for Seed to insert as it would be after some history
// (dead after the broker refused it, pending for an hour), which the real
// path only reaches by waiting or by breaking a broker. Empty fields take
// the defaults given.
type Row struct {
	// State is "pending" (default), "published" or "dead".
	State string
	// Age sets created_at to the database's now() minus Age.
	Age time.Duration
	// LastError is the recorded error (a dead row's reason); "" is none.
	LastError string
	// AggregateType defaults to "order", AggregateID to a new uuid,
	// EventType to "OrderPlaced".
	AggregateType, AggregateID, EventType string
}

// sqlSeed inserts one row; published_at is set for a published row, as
// the relay would.
const sqlSeed = `
	INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
	                           payload, occurred_at, partition, state, last_error, created_at, published_at)
	VALUES ($1, $2, $3, 1, $4, 1, '{}', now() - $6::bigint * interval '1 microsecond', 0, $5, nullif($7, ''),
	        now() - $6::bigint * interval '1 microsecond', CASE WHEN $5 = 'published' THEN now() END)
	RETURNING id`

// Seed inserts r into the outbox's table (db must hold the outbox schema)
// and returns the row's id and event id; it fails the test on any error.
// It is for arranging what a test reads (operator tools, outboxadmin.Backlog, admin
// endpoints); tests of what a service enqueues should enqueue for real and
// use RequireEnqueued.
func Seed(t testing.TB, db SeedDB, r Row) (id int64, eventID uuid.UUID) {
	t.Helper()
	if r.State == "" {
		r.State = "pending"
	}
	if r.AggregateType == "" {
		r.AggregateType = "order"
	}
	if r.AggregateID == "" {
		r.AggregateID = uuid.NewString()
	}
	if r.EventType == "" {
		r.EventType = "OrderPlaced"
	}
	eventID = uuid.New()
	err := db.QueryRow(context.Background(), sqlSeed, eventID, r.AggregateType, r.AggregateID, r.EventType,
		r.State, r.Age.Microseconds(), r.LastError).Scan(&id)
	if err != nil {
		t.Fatalf("outboxtest: seeding a %s row: %v", r.State, err)
	}
	return id, eventID
}
