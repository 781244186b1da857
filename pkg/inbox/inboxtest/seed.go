package inboxtest

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
)

// Row is an inbox row for Seed to insert as it would be after some history
// (a lease whose worker died, an uncertain effect, an old dead letter),
// which the real path only reaches by killing a worker or waiting. Empty
// fields take the defaults given.
type Row struct {
	// Consumer is the inbox's name (inbox.Config.Name); default "inboxtest".
	Consumer string
	// MessageID is the event's id; the zero value takes a new one.
	MessageID uuid.UUID
	// Status is "processed" (default), "stale", "dead_lettered", "leased"
	// or "uncertain".
	Status string
	// Age sets received_at to the database's now() minus Age.
	Age time.Duration
	// LeaseExpiredAgo, for a leased row, sets lease_until to now() minus
	// it (negative: a lease still running) and the owner to "inboxtest".
	LeaseExpiredAgo time.Duration
	// LastError is the recorded error (a dead letter's reason); "" is none.
	LastError string
}

// sqlSeed inserts one row; processed_at is set for a processed row, the
// lease only for a leased one, as the consumer would.
const sqlSeed = `
	INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version, topic,
	                            kafka_partition, kafka_offset, status, last_error, payload_hash, received_at,
	                            processed_at, lease_owner, lease_until)
	VALUES ($1, $2, 'E', 'a', 1, '` + Topic + `', 0, 0, $3, nullif($4, ''), '\x00',
	        now() - $5::bigint * interval '1 microsecond',
	        CASE WHEN $3 = 'processed' THEN now() END,
	        CASE WHEN $3 = 'leased' THEN 'inboxtest' END,
	        CASE WHEN $3 = 'leased' THEN now() - $6::bigint * interval '1 microsecond' END)
	RETURNING message_id`

// Seed inserts r into the inbox's table (db must hold the inbox schema) and
// returns its message id; it fails the test on any error. It is for
// arranging what a test reads (operator tools, inboxadmin.Backlog); tests of a
// handler should deliver for real with Deliver.
func Seed(t testing.TB, db DB, r Row) uuid.UUID {
	t.Helper()
	if r.Consumer == "" {
		r.Consumer = "inboxtest"
	}
	if r.MessageID == uuid.Nil {
		r.MessageID = uuid.New()
	}
	if r.Status == "" {
		r.Status = "processed"
	}
	var id uuid.UUID
	err := db.QueryRow(context.Background(), sqlSeed, r.Consumer, r.MessageID, r.Status, r.LastError,
		r.Age.Microseconds(), r.LeaseExpiredAgo.Microseconds()).Scan(&id)
	if err != nil {
		t.Fatalf("inboxtest: seeding a %s row: %v", r.Status, err)
	}
	return id
}
