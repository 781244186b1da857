package outboxhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/outboxhttp"
	"github.com/onceflow/onceflow/platform/testinfra"
)

func TestOperatorEndpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := outboxtest.NewDatabase(t)
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
	var logs syncBuffer
	srv := httptest.NewServer(http.StripPrefix("/admin/outbox", outboxhttp.Handler(pool, outbox.ModePoll, slog.New(slog.NewJSONHandler(&logs, nil)))))
	defer srv.Close()

	call := func(method, path, body string, wantStatus int) map[string]any {
		t.Helper()
		return testinfra.CallJSON(t, method, srv.URL+"/admin/outbox"+path, body, wantStatus)
	}

	dead := call("GET", "/dead", "", 200)["dead"].([]any)
	if len(dead) != 1 || dead[0].(map[string]any)["lastError"] != "broker said no" {
		t.Fatalf("dead = %v", dead)
	}
	window := fmt.Sprintf(`"from":%q,"to":%q`, time.Now().Add(-time.Hour).Format(time.RFC3339), time.Now().Add(time.Hour).Format(time.RFC3339))
	dry := call("POST", "/replay", `{"aggregateType":"order",`+window+`,"dryRun":true}`, 200)
	if dry["count"] != float64(1) {
		t.Fatalf("replay dry run = %v, want the one published event", dry)
	}
	if implicit := call("POST", "/replay", `{"aggregateType":"order",`+window+`}`, 200); implicit["dryRun"] != true || implicit["count"] != float64(1) {
		t.Fatalf("a replay that does not say dryRun = %v, want a dry run of the one published event", implicit)
	}
	call("POST", "/replay", `{`+window+`,"dryRun":true}`, 422)
	call("POST", "/replay", `{"AGGREGATETYPE":"order"}`, 400)
	call("POST", "/replay", `{"aggregateType":"order"} {}`, 400)
	// Nothing selects "every dead row" but an explicit all.
	for _, body := range []string{`{}`, `{"ids":[]}`, `{"all":true,"limit":-1}`, `{"aggregateType":"order","limit":-5}`,
		`{"all":true,"limit":1001}`, `{"ids":[1],"all":true}`, `{"aggregateId":"o-1"}`, `{"Ids":[1]}`, `{"aggregateType":"o\u0000"}`} {
		if code := call("POST", "/requeue", body, 400)["error"].(map[string]any)["code"]; code != "malformed" {
			t.Fatalf("requeue %s: code %v, want malformed", body, code)
		}
	}
	call("POST", "/replay", `{"aggregateType":`, 400)
	if e := call("POST", "/requeue", `{"ids":[424242]}`, 404)["error"].(map[string]any); e["code"] != "not_found" ||
		!strings.Contains(e["message"].(string), "424242") {
		t.Fatalf("requeue of an unknown id: %v, want not_found naming it", e)
	}
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
	if !strings.Contains(logs.String(), `"msg":"outbox events requeued by an operator"`) || !strings.Contains(logs.String(), `"requeued":1`) {
		t.Fatalf("the requeue was not logged with its count:\n%s", logs.String())
	}
}

// A database error is a 500 whose body has a request id and none of the
// error's text; the log has the text under the same id. (A database without
// the outbox schema: the error is the system's, not the request's.)
func TestInternalErrorsKeepTheirDetailInTheLog(t *testing.T) {
	t.Parallel()
	pool := testinfra.NewPool(t, testinfra.NewDatabase(t))
	var logs syncBuffer
	srv := httptest.NewServer(outboxhttp.Handler(pool, outbox.ModePoll, slog.New(slog.NewJSONHandler(&logs, nil))))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/dead")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var body struct {
		Error struct{ Code, Message, RequestID string }
	}
	_ = json.Unmarshal(raw, &body)
	id := resp.Header.Get("X-Request-Id")
	if resp.StatusCode != 500 || body.Error.Code != "internal" || id == "" || body.Error.RequestID != id {
		t.Fatalf("status %d, X-Request-Id %q, body %s; want 500 with the request id in header and body", resp.StatusCode, id, raw)
	}
	if strings.Contains(string(raw), "outbox_events") || strings.Contains(string(raw), "outbox:") {
		t.Fatalf("the body leaks the internal error: %s", raw)
	}
	if !strings.Contains(logs.String(), `"request_id":"`+id+`"`) || !strings.Contains(logs.String(), "does not exist") {
		t.Fatalf("the log lacks the error under request id %s:\n%s", id, logs.String())
	}
}

// While the database cannot be reached the endpoints answer 503 and say to
// retry (outbox.ErrUnavailable, apperr.Unavailable), without the driver's
// text, which goes to the log.
func TestAnUnreachableDatabaseIs503(t *testing.T) {
	t.Parallel()
	pool := testinfra.NewPool(t, testinfra.NewDatabase(t))
	pool.Close()
	var logs syncBuffer
	srv := httptest.NewServer(outboxhttp.Handler(pool, outbox.ModePoll, slog.New(slog.NewJSONHandler(&logs, nil))))
	defer srv.Close()
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/dead", ""},
		{"POST", "/requeue", `{"ids":[1]}`},
		{"POST", "/replay", `{"aggregateType":"order","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z"}`},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body struct {
			Error struct{ Code, Message, RequestID string }
		}
		_ = json.Unmarshal(raw, &body)
		if resp.StatusCode != http.StatusServiceUnavailable || body.Error.Code != "unavailable" || body.Error.RequestID == "" {
			t.Errorf("%s %s: status %d, body %s; want 503, code unavailable, a request id", c.method, c.path, resp.StatusCode, raw)
		}
		if strings.Contains(string(raw), "closed pool") {
			t.Errorf("%s %s: the body leaks the driver's error: %s", c.method, c.path, raw)
		}
	}
	if !strings.Contains(logs.String(), "closed pool") {
		t.Errorf("the log lacks the driver's error:\n%s", logs.String())
	}
}

// syncBuffer is a log sink the server's goroutines and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
