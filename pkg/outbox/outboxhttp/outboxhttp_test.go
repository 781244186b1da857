package outboxhttp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxhttp"
	"github.com/onceflow/onceflow/pkg/platform/pgutil"
	"github.com/onceflow/onceflow/pkg/platform/testinfra"
)

func TestOperatorEndpoints(t *testing.T) {
	ctx := context.Background()
	pool := testinfra.NewPool(t, testinfra.NewDatabase(t))
	if err := pgutil.Migrate(pool, pgutil.Migration{FS: outbox.Migrations, Table: outbox.MigrationsTable}); err != nil {
		t.Fatal(err)
	}
	ev := event.Envelope{
		EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
		AggregateID: "o-1", AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`),
	}
	published := ev
	published.EventID, published.AggregateVersion = uuid.New(), 2
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.EnqueueBatch(ctx, tx, ev, published) }); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_events SET state = 'dead', attempts = 10, last_error = 'broker said no' WHERE event_id = $1`, ev.EventID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_events SET state = 'published', published_at = now() WHERE event_id = $1`, published.EventID); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.StripPrefix("/admin/outbox", outboxhttp.Handler(pool)))
	defer srv.Close()

	call := func(method, path, body string, wantStatus int) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+"/admin/outbox"+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s %s: status %d, want %d: %v", method, path, resp.StatusCode, wantStatus, out)
		}
		return out
	}

	dead := call("GET", "/dead", "", 200)["dead"].([]any)
	if len(dead) != 1 || dead[0].(map[string]any)["lastError"] != "broker said no" {
		t.Fatalf("dead = %v", dead)
	}
	dry := call("POST", "/replay", `{"aggregateType":"order","dryRun":true}`, 200)
	if dry["count"] != float64(1) {
		t.Fatalf("replay dry run = %v, want the one published event", dry)
	}
	call("POST", "/replay", `{"dryRun":true}`, 422)
	call("POST", "/replay", `{"aggregateType":`, 400)
	call("GET", "/dead?limit=0", "", 400)
	if got := call("POST", "/requeue", `{"aggregateType":"order"}`, 200)["requeued"]; got != float64(1) {
		t.Fatalf("requeued = %v, want 1", got)
	}
	var state string
	if err := pool.QueryRow(ctx, `SELECT state FROM outbox_events WHERE event_id = $1`, ev.EventID).Scan(&state); err != nil || state != "pending" {
		t.Fatalf("state after requeue = %q (%v), want pending", state, err)
	}
	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE state = 'pending'`).Scan(&pending); err != nil || pending != 1 {
		t.Fatalf("the dry run changed something: %d pending (%v)", pending, err)
	}
}
