package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/outboxhttp"
	"github.com/onceflow/onceflow/platform/testinfra"
)

const token = "s3cret"

// ordersAdmin is orders' operator listener as the service mounts it: the
// platform's operator echo (bearer token, /metrics) with the real outboxhttp
// handler over a real, migrated database, and the real outbox backlog gauges.
func ordersAdmin(t *testing.T) (*httptest.Server, *pgxpool.Pool) {
	t.Helper()
	pool := outboxtest.NewDatabase(t)
	reg := prometheus.NewRegistry()
	m := outbox.NewMetrics(reg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = m.WatchBacklog(ctx, pool, 50*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	e := httpserver.NewAdmin(httpserver.AdminConfig{Logger: logger, Gatherer: reg, Token: token})
	e.Any("/admin/outbox/*", echo.WrapHandler(http.StripPrefix("/admin/outbox", outboxhttp.Handler(pool, outbox.ModePoll, logger))))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv, pool
}

func insertOutbox(t *testing.T, pool *pgxpool.Pool, state string, age time.Duration) (int64, uuid.UUID) {
	t.Helper()
	r := outboxtest.Row{State: state, Age: age}
	if state == "dead" {
		r.LastError = "broker refused: too large"
	}
	return outboxtest.Seed(t, pool, r)
}

func ctl(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), append([]string{"onceflowctl"}, args...), func(k string) string { return env[k] }, &out)
	return out.String(), err
}

func TestStatusDeadLettersAndReplayAgainstTheRealOutboxHandlers(t *testing.T) {
	t.Parallel()
	srv, pool := ordersAdmin(t)
	// billing, the shim and the third party are down: status still reports orders.
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	env := map[string]string{"ADMIN_TOKEN": token, "ONCEFLOW_ORDERS_ADMIN": srv.URL,
		"ONCEFLOW_BILLING_ADMIN": down.URL, "ONCEFLOW_SHIM_ADMIN": down.URL, "ONCEFLOW_RECONCILER_ADMIN": down.URL}

	deadID, deadEvent := insertOutbox(t, pool, "dead", time.Hour)
	insertOutbox(t, pool, "pending", 2*time.Minute)
	insertOutbox(t, pool, "published", 30*time.Minute)

	// status: a table a person reads, with orders' numbers from /metrics.
	var out string
	testinfra.WaitFor(t, 10*time.Second, "status to show orders' pending and dead rows", func() (bool, error) {
		var err error
		out, err = ctl(t, env, "status")
		if err == nil || !strings.Contains(err.Error(), "3 of 4 services could not be read") {
			return false, err
		}
		// The backlog gauges refresh every 50 ms, each from its own query.
		lines := strings.Split(out, "\n")
		return len(lines) > 1 && strings.HasPrefix(lines[1], "orders ") &&
			strings.Fields(lines[1])[1] == "1" && strings.Fields(lines[1])[2] != "0.0s" && strings.Fields(lines[1])[3] == "1", nil
	})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 7 || !strings.HasPrefix(lines[0], "SERVICE") || lines[6] != "verdict: failing" {
		t.Fatalf("status table:\n%s", out)
	}
	orders := strings.Fields(lines[1])
	if orders[0] != "orders" || orders[2] == "0.0s" || !strings.HasSuffix(orders[2], "s") || orders[4] != "-" ||
		!strings.Contains(lines[1], "degraded: dead letters waiting") {
		t.Fatalf("orders row = %q, want an age, no consumer lag and the verdict:\n%s", orders, out)
	}
	if !strings.Contains(lines[2], "unreachable") {
		t.Fatalf("billing row = %q, want unreachable", lines[2])
	}
	// The columns line up under the header.
	if h, r := strings.Index(lines[0], "OUTBOX DEAD"), strings.Index(lines[1], " 1 "); h < 0 || r < 0 {
		t.Fatalf("unaligned:\n%s", out)
	}
	out, _ = ctl(t, env, "-o", "json", "status")
	var rep StatusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Verdict != "failing" || len(rep.Services) != 4 ||
		rep.Services[0].OutboxPending == nil || *rep.Services[0].OutboxPending != 1 || rep.Services[0].Verdict != "degraded" {
		t.Fatalf("status -o json = %s (%v)", out, err)
	}

	// Without the token, the service says 401 and the tool says why.
	_, err := ctl(t, map[string]string{"ONCEFLOW_ORDERS_ADMIN": srv.URL}, "dead-letters", "list", "-service", "orders")
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "ADMIN_TOKEN") {
		t.Fatalf("without a token: err = %v", err)
	}

	// dead-letters list.
	out, err = ctl(t, env, "dead-letters", "list", "-service", "orders")
	if err != nil || !strings.Contains(out, deadEvent.String()) || !strings.Contains(out, "broker refused: too large") {
		t.Fatalf("dead-letters list = %v\n%s", err, out)
	}
	out, err = ctl(t, env, "-o", "json", "dead-letters", "list", "-service", "orders")
	var dls []DeadLetter
	if err != nil || json.Unmarshal([]byte(out), &dls) != nil || len(dls) != 1 || dls[0].ID != deadID || dls[0].Kind != "outbox" {
		t.Fatalf("dead-letters list -o json = %v\n%s", err, out)
	}

	// requeue needs a selector: an empty one never means "all".
	if _, err := ctl(t, env, "dead-letters", "requeue", "-service", "orders"); err == nil || !strings.Contains(err.Error(), "exactly one of") {
		t.Fatalf("requeue without a selector: err = %v", err)
	}
	out, err = ctl(t, env, "dead-letters", "requeue", "-service", "orders", "-ids", itoa(deadID))
	if err != nil || !strings.Contains(out, "requeued 1") {
		t.Fatalf("requeue -ids = %v\n%s", err, out)
	}
	state := ""
	for _, ev := range outboxtest.Enqueued(t, pool, outboxtest.Match{}) {
		if ev.EventID == deadEvent {
			state = ev.State
		}
	}
	if state != "pending" {
		t.Fatalf("requeued row is %q, want pending", state)
	}

	// -all is said explicitly, and the real handler takes it.
	insertOutbox(t, pool, "dead", time.Minute)
	out, err = ctl(t, env, "dead-letters", "requeue", "-service", "orders", "-all")
	if err != nil || !strings.Contains(out, "requeued 1") {
		t.Fatalf("requeue -all = %v\n%s", err, out)
	}

	// replay: a dry run unless -apply, and a dry run changes nothing.
	pendingBefore := countPending(t, pool)
	out, err = ctl(t, env, "replay", "-service", "orders", "-aggregate-type", "order", "-from", "1h")
	if err != nil || !strings.Contains(out, "dry run: 1 event(s)") || countPending(t, pool) != pendingBefore {
		t.Fatalf("replay dry run = %v\n%s", err, out)
	}
	out, err = ctl(t, env, "replay", "-service", "orders", "-aggregate-type", "order", "-from", "1h", "-apply")
	if err != nil || !strings.Contains(out, "1 event(s) of orders queued") || countPending(t, pool) != pendingBefore+1 {
		t.Fatalf("replay -apply = %v\n%s", err, out)
	}
}

func countPending(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	return len(outboxtest.Enqueued(t, pool, outboxtest.Match{State: "pending"}))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// The requests the tool sends for what the shared handlers decide per
// service (the operator listener's contract): "all" said explicitly, inbox
// dead letters by topic and event id, replay always saying dryRun.
func TestRequestsFollowTheOperatorContract(t *testing.T) {
	t.Parallel()
	type seen struct {
		method, path, query, auth string
		body                      map[string]any
	}
	var mu sync.Mutex
	var reqs []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		reqs = append(reqs, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Authorization"), body})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/dead-letters/requeue") && body["all"] == true && body["after"] == nil:
			// A pass longer than one call: the tool must follow "next".
			_, _ = io.WriteString(w, `{"requeued": 3, "next": "0:3:5"}`)
		case strings.HasSuffix(r.URL.Path, "/dead-letters/requeue"):
			_, _ = io.WriteString(w, `{"requeued": 2, "next": ""}`)
		case strings.HasSuffix(r.URL.Path, "/requeue"):
			_, _ = io.WriteString(w, `{"requeued": 3}`)
		case strings.Contains(r.URL.Path, "/parked/"):
			_, _ = io.WriteString(w, `{"action": "release", "dead": ["6f1c8a4e-1d2b-4c3d-9e8f-0a1b2c3d4e5f"], "parked": 2}`)
		case strings.HasSuffix(r.URL.Path, "/replay"):
			_, _ = io.WriteString(w, `{"dryRun": true, "count": 0, "events": []}`)
		default:
			_, _ = io.WriteString(w, `{"deadLetters": [{"eventId": "6f1c8a4e-1d2b-4c3d-9e8f-0a1b2c3d4e5f", "eventType": "PaymentCaptured", "reason": "exhausted", "consumer": "reconciler-shim", "failedAt": "2026-01-01T00:00:00Z"}]}`)
		}
	}))
	defer srv.Close()
	env := map[string]string{"ADMIN_TOKEN": token, "ONCEFLOW_BILLING_ADMIN": srv.URL, "ONCEFLOW_SHIM_ADMIN": strings.TrimPrefix(srv.URL, "http://")}
	id := "6f1c8a4e-1d2b-4c3d-9e8f-0a1b2c3d4e5f"
	for _, args := range [][]string{
		{"dead-letters", "requeue", "-service", "billing", "-kind", "outbox", "-all"},
		{"dead-letters", "requeue", "-service", "shim", "-event-ids", id},
		{"dead-letters", "requeue", "-service", "reconciler-shim", "-all", "-consumer", "reconciler-shim"},
		{"dead-letters", "list", "-service", "shim", "-limit", "5"},
		{"parked", "-service", "shim", "-consumer", "reconciler-shim", "-limit", "7"},
		{"replay", "-service", "billing", "-aggregate-type", "order", "-from", "2026-01-01T00:00:00Z", "-to", "2026-01-02T00:00:00Z"},
		{"parked", "release", "-service", "shim", "-consumer", "reconciler-shim", "-aggregate-type", "payment", "-aggregate", "o-1",
			"-reason", "its dead letter expired", "-operator", "alice"},
	} {
		out, err := ctl(t, env, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		if args[0] == "dead-letters" && slices.Contains(args, "-consumer") && !strings.Contains(out, "requeued 5 inbox") {
			t.Fatalf("%v printed %q, want the pass's total: requeued 5 inbox …", args, out)
		}
	}
	// billing has both: the tool refuses to guess.
	if _, err := ctl(t, env, "dead-letters", "requeue", "-service", "billing", "-all"); err == nil || !strings.Contains(err.Error(), "-kind") {
		t.Fatalf("requeue on billing without -kind: err = %v", err)
	}
	want := []seen{
		{"POST", "/admin/outbox/requeue", "", "Bearer " + token, map[string]any{"all": true}},
		{"POST", "/admin/inbox/dead-letters/requeue", "", "Bearer " + token, map[string]any{"topic": "billing.events", "eventIds": []any{id}}},
		{"POST", "/admin/inbox/dead-letters/requeue", "", "Bearer " + token, map[string]any{"topic": "billing.events", "all": true, "consumer": "reconciler-shim"}},
		{"POST", "/admin/inbox/dead-letters/requeue", "", "Bearer " + token, map[string]any{"topic": "billing.events", "all": true, "consumer": "reconciler-shim", "after": "0:3:5"}},
		{"GET", "/admin/inbox/dead-letters", "limit=5&topic=billing.events", "Bearer " + token, nil},
		{"GET", "/admin/inbox/parked", "consumer=reconciler-shim&limit=7", "Bearer " + token, nil},
		{"POST", "/admin/outbox/replay", "", "Bearer " + token, map[string]any{"aggregateType": "order",
			"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "dryRun": true}},
		{"POST", "/admin/inbox/parked/release", "", "Bearer " + token, map[string]any{"aggregateId": "o-1", "aggregateType": "payment",
			"consumer": "reconciler-shim", "operator": "alice", "reason": "its dead letter expired"}},
	}
	if len(reqs) != len(want) {
		t.Fatalf("%d requests, want %d: %+v", len(reqs), len(want), reqs)
	}
	for i := range want {
		g, w := reqs[i], want[i]
		gb, _ := json.Marshal(g.body)
		wb, _ := json.Marshal(w.body)
		if g.method != w.method || g.path != w.path || g.query != w.query || g.auth != w.auth || string(gb) != string(wb) {
			t.Errorf("request %d = %s %s?%s %s %s, want %s %s?%s %s %s", i, g.method, g.path, g.query, g.auth, gb, w.method, w.path, w.query, w.auth, wb)
		}
	}
}
