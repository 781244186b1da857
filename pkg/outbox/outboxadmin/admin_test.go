package outboxadmin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
)

// adminDB returns a pool on a fresh database with the outbox schema.
func adminDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return outboxtest.NewDatabase(t)
}

// replayT0 anchors the replay scenarios' created_at times.
var replayT0 = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

// longAgo opens a replay window before every seeded row: a replay always
// takes a window.
var longAgo = replayT0.Add(-24 * time.Hour)

// seedReplayScenario writes rows of several aggregates, states and times.
func seedReplayScenario(t *testing.T, pool *pgxpool.Pool) []seeded {
	t.Helper()
	h := time.Hour
	return seedRows(t, pool,
		row{AggType: "thing", AggID: "a", Version: 1, State: "published", PublishedAgo: h, CreatedAt: replayT0},            // 0
		row{AggType: "thing", AggID: "a", Version: 2, State: "published", PublishedAgo: h, CreatedAt: replayT0.Add(h)},     // 1
		row{AggType: "thing", AggID: "b", Version: 1, State: "published", PublishedAgo: h, CreatedAt: replayT0.Add(h)},     // 2
		row{AggType: "thing", AggID: "a", Version: 3, State: "published", PublishedAgo: h, CreatedAt: replayT0.Add(2 * h)}, // 3: exactly at a To below
		row{AggType: "other", AggID: "a", Version: 1, State: "published", PublishedAgo: h, CreatedAt: replayT0.Add(h)},     // 4: another aggregate type
		row{AggType: "thing", AggID: "a", Version: 4, State: "pending", CreatedAt: replayT0.Add(3 * h)},                    // 5: not published yet
		row{AggType: "thing", AggID: "a", Version: 5, State: "dead", CreatedAt: replayT0.Add(3 * h)},                       // 6: dead, not published
		row{AggType: "thing", AggID: "c", Version: 1, State: "published", PublishedAgo: time.Minute},                       // 7: created just now
	)
}

var replayScopes = []struct {
	name   string
	filter outboxadmin.ReplayFilter
	want   []int // indexes into seedReplayScenario
}{
	{"aggregate type", outboxadmin.ReplayFilter{AggregateType: "thing", From: longAgo}, []int{0, 1, 2, 3, 7}},
	{"one aggregate", outboxadmin.ReplayFilter{AggregateType: "thing", AggregateID: "a", From: longAgo}, []int{0, 1, 3}},
	{"half-open window", outboxadmin.ReplayFilter{AggregateType: "thing", From: replayT0.Add(time.Hour), To: replayT0.Add(2 * time.Hour)}, []int{1, 2}},
	{"from only: up to now", outboxadmin.ReplayFilter{AggregateType: "thing", From: replayT0.Add(time.Hour)}, []int{1, 2, 3, 7}},
	{"to bounds the window", outboxadmin.ReplayFilter{AggregateType: "thing", From: longAgo, To: replayT0.Add(time.Hour)}, []int{0}},
	{"one aggregate in a window", outboxadmin.ReplayFilter{AggregateType: "thing", AggregateID: "a", From: replayT0.Add(time.Minute), To: replayT0.Add(3 * time.Hour)}, []int{1, 3}},
	{"other type", outboxadmin.ReplayFilter{AggregateType: "other", From: longAgo}, []int{4}},
	{"nothing in scope", outboxadmin.ReplayFilter{AggregateType: "thing", AggregateID: "nope", From: longAgo}, nil},
}

func itemIDs(items []outboxadmin.ReplayItem) []int64 {
	ids := []int64{}
	for _, it := range items {
		ids = append(ids, it.ID)
	}
	return ids
}

func TestReplayDryRunListsTheScopeAndChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s, _, before := seedScope(t, seedReplayScenario) // no scope: every row watched
	for _, tt := range replayScopes {
		t.Run(tt.name, func(t *testing.T) {
			items, err := outboxadmin.Replay(ctx, pool, outbox.ModePoll, tt.filter, true)
			if err != nil {
				t.Fatal(err)
			}
			equalIDs(t, "dry run", itemIDs(items), idsOf(s, tt.want...))
			for i, it := range items {
				w := s[tt.want[i]]
				if it.EventID != w.EventID || it.EventType != "ThingHappened" || it.CreatedAt.IsZero() {
					t.Fatalf("item %d = %+v, want event id %s", i, it, w.EventID)
				}
			}
			before.unchanged(t, "a dry run")
		})
	}
	// The items carry the aggregate and the creation time as stored.
	items, err := outboxadmin.Replay(ctx, pool, outbox.ModePoll, outboxadmin.ReplayFilter{AggregateType: "thing", AggregateID: "a", From: longAgo, To: replayT0.Add(90 * time.Minute)}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 2 || items[1].AggregateID != "a" || items[1].AggregateVersion != 2 || !items[1].CreatedAt.Equal(replayT0.Add(time.Hour)) {
		t.Fatalf("items = %+v, want thing/a v1 and v2, the second created at %s", items, replayT0.Add(time.Hour))
	}
}

func TestReplayFlipsExactlyTheScopedRowsToPendingKeepingEventIDs(t *testing.T) {
	t.Parallel()
	for _, tt := range replayScopes {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			pool, s, want, untouched := seedScope(t, seedReplayScenario, tt.want...)

			items, err := outboxadmin.Replay(ctx, pool, outbox.ModePoll, tt.filter, false)
			if err != nil {
				t.Fatal(err)
			}
			equalIDs(t, "replayed", itemIDs(items), want)
			// Due now, with a fresh budget, under the same event ids: the relay's
			// claim picks them up and consumers' inboxes see duplicates.
			var eventIDs []uuid.UUID
			for _, i := range tt.want {
				eventIDs = append(eventIDs, s[i].EventID)
			}
			replayed := tableIDs(t, pool, "outbox_events", `id = ANY($1) AND event_id = ANY($2) AND state = 'pending'
				AND attempts = 0 AND published_at IS NULL AND next_attempt_at = '-infinity'`, want, eventIDs)
			equalIDs(t, "rows pending again under their event ids", replayed, want)
			untouched.unchanged(t, "replaying the rows in scope")

			again, err := outboxadmin.Replay(ctx, pool, outbox.ModePoll, tt.filter, false)
			if err != nil || len(again) != 0 {
				t.Fatalf("replaying again before the relay ran: %d items, err %v; want none", len(again), err)
			}
		})
	}
}

func TestReplayRefusesAnInvalidFilter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _, _, before := seedScope(t, seedReplayScenario)
	tests := []struct {
		name   string
		filter outboxadmin.ReplayFilter
	}{
		{"no aggregate type", outboxadmin.ReplayFilter{AggregateID: "a"}},
		{"zero filter", outboxadmin.ReplayFilter{}},
		{"no window", outboxadmin.ReplayFilter{AggregateType: "thing"}},
		{"To without From", outboxadmin.ReplayFilter{AggregateType: "thing", To: replayT0}},
		{"Max above MaxReplay", outboxadmin.ReplayFilter{AggregateType: "thing", From: longAgo, Max: outboxadmin.MaxReplay + 1}},
		{"To equals From", outboxadmin.ReplayFilter{AggregateType: "thing", From: replayT0, To: replayT0}},
		{"To before From", outboxadmin.ReplayFilter{AggregateType: "thing", From: replayT0.Add(time.Hour), To: replayT0}},
	}
	for _, tt := range tests {
		for _, dryRun := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/dryRun=%v", tt.name, dryRun), func(t *testing.T) {
				items, err := outboxadmin.Replay(ctx, pool, outbox.ModePoll, tt.filter, dryRun)
				if !errors.Is(err, outboxadmin.ErrInvalidFilter) || items != nil {
					t.Fatalf("Replay(%+v) = %d items, err %v; want ErrInvalidFilter", tt.filter, len(items), err)
				}
			})
		}
	}
	before.unchanged(t, "a refused replay")
}

func TestReplayRefusesAScopeLargerThanMaxReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := adminDB(t)
	// MaxReplay rows of one aggregate and one of another, all published.
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
		                           event_version, payload, occurred_at, partition, state, attempts, published_at)
		SELECT gen_random_uuid(), 'bulk', CASE WHEN g <= $1 THEN 'big' ELSE 'small' END, g, 'ThingHappened',
		       1, '{}', now(), 0, 'published', 1, now()
		FROM generate_series(1, $1 + 1) g`, outboxadmin.MaxReplay)
	if err != nil {
		t.Fatal(err)
	}

	for _, dryRun := range []bool{true, false} {
		items, err := outboxadmin.Replay(ctx, pool, outbox.ModePoll, outboxadmin.ReplayFilter{AggregateType: "bulk", From: longAgo}, dryRun)
		if !errors.Is(err, outboxadmin.ErrReplayTooLarge) || items != nil {
			t.Fatalf("dryRun=%v: %d items, err %v; want ErrReplayTooLarge", dryRun, len(items), err)
		}
		if want := fmt.Sprint(outboxadmin.MaxReplay + 1); !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not tell the scope's size, %s", err, want)
		}
	}
	var published int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE state = 'published'").Scan(&published); err != nil {
		t.Fatal(err)
	}
	if published != outboxadmin.MaxReplay+1 {
		t.Fatalf("%d rows published after a refused replay, want all %d", published, outboxadmin.MaxReplay+1)
	}

	// Exactly MaxReplay is allowed.
	items, err := outboxadmin.Replay(ctx, pool, outbox.ModePoll, outboxadmin.ReplayFilter{AggregateType: "bulk", AggregateID: "big", From: longAgo}, false)
	if err != nil || len(items) != outboxadmin.MaxReplay {
		t.Fatalf("replaying exactly MaxReplay events: %d items, err %v", len(items), err)
	}
	if !slices.IsSortedFunc(items, func(a, b outboxadmin.ReplayItem) int { return int(a.ID - b.ID) }) {
		t.Fatal("replayed items are not in id order")
	}
}

// seedDeadScenario writes dead rows among others.
func seedDeadScenario(t *testing.T, pool *pgxpool.Pool) []seeded {
	t.Helper()
	return seedRows(t, pool,
		row{AggType: "thing", AggID: "a", Version: 1, State: "dead"},                         // 0
		row{AggType: "thing", AggID: "b", Version: 1, State: "dead"},                         // 1
		row{AggType: "thing", AggID: "c", Version: 1, State: "pending"},                      // 2
		row{AggType: "thing", AggID: "d", Version: 1, State: "published", PublishedAgo: day}, // 3
		row{AggType: "other", AggID: "a", Version: 1, State: "dead"},                         // 4
		row{AggType: "thing", AggID: "a", Version: 2, State: "dead"},                         // 5
	)
}

// rowsWatch is a snapshot of the outbox rows an operation must leave alone,
// taken before it runs.
type rowsWatch struct {
	pool   *pgxpool.Pool
	where  string
	args   []any
	before string
}

// watchRows snapshots the outbox_events rows matching where (with args).
func watchRows(t *testing.T, pool *pgxpool.Pool, where string, args ...any) rowsWatch {
	t.Helper()
	return rowsWatch{pool: pool, where: where, args: args, before: snapshot(t, pool, "outbox_events", where, args...)}
}

// unchanged fails the test if the watched rows differ from the snapshot;
// what names the operation that must not have changed them.
func (w rowsWatch) unchanged(t *testing.T, what string) {
	t.Helper()
	if after := snapshot(t, w.pool, "outbox_events", w.where, w.args...); after != w.before {
		t.Fatalf("%s changed rows it must leave alone:\nbefore %s\n after %s", what, w.before, after)
	}
}

// seedScope seeds a fresh database with scenario and returns, beside the
// pool and the seeded rows, the ids of the rows at the indexes in scope
// (what the operation under test must change) and a watch on all the
// others (which it must not): with no scope, on every row.
func seedScope(t *testing.T, scenario func(*testing.T, *pgxpool.Pool) []seeded, scope ...int) (*pgxpool.Pool, []seeded, []int64, rowsWatch) {
	t.Helper()
	pool := adminDB(t)
	s := scenario(t, pool)
	want := idsOf(s, scope...)
	return pool, s, want, watchRows(t, pool, "id <> ALL($1)", want)
}

// checkRequeued fails unless the requeue (the function named what, which
// returned n and err) requeued exactly the rows want (due now, a fresh
// budget, the cause kept), said so, and left the rows untouched watches as
// they were.
func checkRequeued(t *testing.T, pool *pgxpool.Pool, what string, n int, err error, want []int64, untouched rowsWatch) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if n != len(want) {
		t.Fatalf("%s returned %d, want %d", what, n, len(want))
	}
	got := tableIDs(t, pool, "outbox_events", `state = 'pending' AND attempts = 0 AND next_attempt_at = '-infinity'
		AND last_error = 'requeued: broker said no'`)
	equalIDs(t, "requeued rows", got, want)
	untouched.unchanged(t, "requeuing")
}

func TestRequeueMovesOnlyDeadRowsBackToPending(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ids  func(s []seeded) []int64
		want []int // indexes into seedDeadScenario
	}{
		{"dead rows", func(s []seeded) []int64 { return idsOf(s, 0, 1) }, []int{0, 1}},
		{"pending and published ids are ignored",
			func(s []seeded) []int64 { return idsOf(s, 0, 2, 3) }, []int{0}},
		{"only rows that are not dead", func(s []seeded) []int64 { return idsOf(s, 2, 3) }, nil},
		{"an id given twice counts once", func(s []seeded) []int64 { return idsOf(s, 4, 4) }, []int{4}},
		{"no ids", func([]seeded) []int64 { return nil }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			pool, s, want, untouched := seedScope(t, seedDeadScenario, tt.want...)

			n, err := outboxadmin.Requeue(ctx, pool, outbox.ModePoll, tt.ids(s)...)
			checkRequeued(t, pool, "Requeue", n, err, want, untouched)
			if n, err := outboxadmin.Requeue(ctx, pool, outbox.ModePoll, tt.ids(s)...); err != nil || n != 0 {
				t.Fatalf("requeuing again: n=%d err=%v, want 0: the rows are no longer dead", n, err)
			}
		})
	}
}

// An id that names no row is reported, not skipped: the operator mistyped
// it, or the row was pruned, and a requeue that quietly did less than asked
// would hide that. Nothing is requeued then, so the corrected call does it
// all.
func TestRequeueOfAnUnknownIDIsNotFoundAndRequeuesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s, _, untouched := seedScope(t, seedDeadScenario)
	n, err := outboxadmin.Requeue(ctx, pool, outbox.ModePoll, append(idsOf(s, 0, 1), 999_999, 999_998)...)
	if !errors.Is(err, outboxadmin.ErrNotFound) || n != 0 {
		t.Fatalf("Requeue with unknown ids: n=%d err=%v, want 0 and ErrNotFound", n, err)
	}
	if !strings.Contains(err.Error(), "999998, 999999") {
		t.Errorf("the error %q does not name the unknown ids", err)
	}
	untouched.unchanged(t, "a refused requeue")
}

func TestRequeueDeadByFilter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		filter outboxadmin.DeadFilter
		want   []int // indexes into seedDeadScenario
	}{
		{"every dead row", outboxadmin.DeadFilter{}, []int{0, 1, 4, 5}},
		{"aggregate type", outboxadmin.DeadFilter{AggregateType: "thing"}, []int{0, 1, 5}},
		{"one aggregate", outboxadmin.DeadFilter{AggregateType: "thing", AggregateID: "a"}, []int{0, 5}},
		{"aggregate id across types", outboxadmin.DeadFilter{AggregateID: "a"}, []int{0, 4, 5}},
		{"limit takes the oldest", outboxadmin.DeadFilter{Limit: 2}, []int{0, 1}},
		{"limit within a type", outboxadmin.DeadFilter{AggregateType: "thing", Limit: 1}, []int{0}},
		{"no match", outboxadmin.DeadFilter{AggregateType: "nope"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			pool, _, want, untouched := seedScope(t, seedDeadScenario, tt.want...)

			n, err := outboxadmin.RequeueDead(ctx, pool, outbox.ModePoll, tt.filter)
			checkRequeued(t, pool, "RequeueDead", n, err, want, untouched)
		})
	}
}

func TestListDeadShowsDeadRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := adminDB(t)
	s := seedDeadScenario(t, pool)

	dead, err := outboxadmin.ListDead(ctx, pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, d := range dead {
		got = append(got, d.ID)
	}
	equalIDs(t, "ListDead", got, idsOf(s, 0, 1, 4, 5))
	d := dead[2]
	if d.EventID != s[4].EventID || d.EventType != "ThingHappened" || d.AggregateType != "other" ||
		d.AggregateID != "a" || d.AggregateVersion != 1 || d.Attempts != 3 || d.LastError != "broker said no" ||
		d.CreatedAt.IsZero() {
		b, _ := json.Marshal(d)
		t.Fatalf("dead event = %s, want other/a v1, event %s, 3 attempts, last error %q", b, s[4].EventID, "broker said no")
	}

	limited, err := outboxadmin.ListDead(ctx, pool, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(limited) != 2 || limited[0].ID != s[0].ID || limited[1].ID != s[1].ID {
		t.Fatalf("ListDead(limit 2) = %+v, want the two oldest dead rows", limited)
	}

	if _, err := outboxadmin.Requeue(ctx, pool, outbox.ModePoll, s[0].ID); err != nil {
		t.Fatal(err)
	}
	dead, err = outboxadmin.ListDead(ctx, pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, d := range dead {
		got = append(got, d.ID)
	}
	equalIDs(t, "ListDead after a requeue", got, idsOf(s, 1, 4, 5))
}
