package inboxtesting

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/testenv"
)

// Day is a day, for the ages of seeded rows.
const Day = 24 * time.Hour

// Row is one inbox row of a scenario, as the consumer would have left it
// (NewRow makes one).
type Row struct {
	Consumer string
	ID       uuid.UUID
	Status   string        // processed, stale or dead_lettered
	Age      time.Duration // processed_at (and received_at) = now() - Age
}

// NewRow is the Row of consumer's message id, in status, Age old.
func NewRow(consumer string, id uuid.UUID, status string, age time.Duration) Row {
	return Row{Consumer: consumer, ID: id, Status: status, Age: age}
}

// SeedRows writes rows into pool's inbox_messages.
func SeedRows(t *testing.T, pool *pgxpool.Pool, rows ...Row) {
	t.Helper()
	for i, r := range rows {
		// Dead-lettered rows get an old processed_at too, so that only the
		// status can keep Prune away from them.
		_, err := pool.Exec(context.Background(), `
			INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
			                            topic, kafka_partition, kafka_offset, status, last_error, payload_hash,
			                            received_at, processed_at)
			VALUES ($1, $2, 'ThingHappened', 'agg', 1, 'things', 0, $3, $4,
			        CASE $4 WHEN 'dead_lettered' THEN 'boom' END, '\x00',
			        now() - $5::bigint * interval '1 microsecond', now() - $5::bigint * interval '1 microsecond')`,
			r.Consumer, r.ID, i, r.Status, r.Age.Microseconds())
		if err != nil {
			t.Fatalf("seeding inbox row %d: %v", i, err)
		}
	}
}

// Rows lists every inbox row as "consumer status message_id", sorted.
func Rows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return testenv.QueryColumn[string](t, pool, `SELECT consumer || ' ' || status || ' ' || message_id FROM inbox_messages ORDER BY 1`)
}

// RowKey is a row as Rows lists it.
func RowKey(consumer, status string, id uuid.UUID) string {
	return consumer + " " + status + " " + id.String()
}

// SortedKeys sorts keys, to compare with Rows.
func SortedKeys(keys ...string) []string { slices.Sort(keys); return keys }

// EqualStrings fails t unless got is want, naming what.
func EqualStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}
