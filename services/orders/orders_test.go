package orders_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/logging"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/orders"
)

type api struct {
	e    *echo.Echo
	pool *pgxpool.Pool
	reg  *prometheus.Registry
}

// newAPI serves the orders API on a fresh, migrated database.
func newAPI(t *testing.T) *api {
	t.Helper()
	pool := testinfra.NewPool(t, migratedDatabase(t))
	logger, _ := logging.New(&strings.Builder{}, "orders-test", "error")
	reg := prometheus.NewRegistry()
	e := httpserver.New(httpserver.Config{Logger: logger, Gatherer: reg})
	orders.Routes(e, orders.New(pool, orders.Options{}).WithMetrics(orders.NewMetrics(reg)))
	return &api{e: e, pool: pool, reg: reg}
}

func (a *api) do(t *testing.T, method, path, body string, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	a.e.ServeHTTP(rec, req)
	return rec
}

func (a *api) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := a.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("decoding %q: %v", rec.Body.String(), err)
	}
	return v
}

const validOrder = `{"customerId":"cust-1","amountCents":1999,"currency":"EUR"}`

func TestPlaceWritesTheOrderAndItsEventTogether(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	rec := a.do(t, http.MethodPost, "/orders", validOrder, "X-Request-Id", "req-42")
	if rec.Code != http.StatusCreated {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	o := decode[orders.Order](t, rec)
	if o.Status != orders.StatusPlaced || o.Version != 1 || o.AmountCents != 1999 || o.Currency != "EUR" {
		t.Fatalf("order = %+v", o)
	}
	ev := outboxtest.RequireEnqueued(t, a.pool, outboxtest.Match{})
	if ev.EventType != orders.EventOrderPlaced || ev.AggregateID != o.ID.String() || ev.AggregateVersion != 1 || ev.CorrelationID != "req-42" {
		t.Fatalf("outbox row: %s %s v%d correlation %q", ev.EventType, ev.AggregateID, ev.AggregateVersion, ev.CorrelationID)
	}
	var payload orders.OrderPlaced
	if err := json.Unmarshal(ev.Payload, &payload); err != nil {
		t.Fatal(err)
	}
	if payload.OrderID != o.ID || payload.AmountCents != 1999 || payload.CustomerID != "cust-1" {
		t.Fatalf("payload = %+v", payload)
	}

	got := a.do(t, http.MethodGet, "/orders/"+o.ID.String(), "")
	if got.Code != http.StatusOK || decode[orders.Order](t, got).ID != o.ID {
		t.Fatalf("GET: %d %s", got.Code, got.Body)
	}
}

func TestBadInputGetsA4xxAndWritesNothing(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	tests := []struct {
		name   string
		body   string
		status int
		want   string
	}{
		{"malformed JSON", `{"customerId": "c",`, http.StatusBadRequest, "not valid JSON"},
		{"empty body", ``, http.StatusBadRequest, "empty"},
		{"not an object", `[1,2]`, http.StatusBadRequest, "not valid JSON"},
		{"unknown field", `{"customerId":"c","amountCents":1,"currency":"EUR","discount":5}`, http.StatusBadRequest, "discount"},
		{"trailing data", validOrder + `{}`, http.StatusBadRequest, "after the JSON object"},
		{"fractional amount", `{"customerId":"c","amountCents":1.5,"currency":"EUR"}`, http.StatusBadRequest, "amountCents"},
		{"negative amount", `{"customerId":"c","amountCents":-100,"currency":"EUR"}`, http.StatusUnprocessableEntity, "amountCents must be a positive integer"},
		{"zero amount", `{"customerId":"c","amountCents":0,"currency":"EUR"}`, http.StatusUnprocessableEntity, "amountCents"},
		{"huge amount", `{"customerId":"c","amountCents":99999999999999,"currency":"EUR"}`, http.StatusUnprocessableEntity, "at most"},
		{"unknown currency", `{"customerId":"c","amountCents":100,"currency":"XYZ"}`, http.StatusUnprocessableEntity, `currency "XYZ"`},
		{"missing customer", `{"amountCents":100,"currency":"EUR"}`, http.StatusUnprocessableEntity, "customerId"},
		{"2 MB body", `{"customerId":"` + strings.Repeat("x", 2<<20) + `","amountCents":1,"currency":"EUR"}`, http.StatusRequestEntityTooLarge, "larger than the limit of 1MB"},
		// encoding/json alone would match these names case-insensitively and place the order.
		{"upper-case field", `{"CUSTOMERID":"c","amountCents":1,"currency":"EUR"}`, http.StatusBadRequest, `unknown field "CUSTOMERID"`},
		{"mixed-case field", `{"customerId":"c","AmountCents":1,"currency":"EUR"}`, http.StatusBadRequest, `unknown field "AmountCents"`},
		// Postgres refuses NUL and invalid UTF-8 in text; encoding/json would
		// pass the NUL through and silently replace the invalid bytes.
		{"NUL in a string", `{"customerId":"c\u0000","amountCents":1,"currency":"EUR"}`, http.StatusBadRequest, "NUL"},
		{"invalid UTF-8", "{\"customerId\":\"c\xff\",\"amountCents\":1,\"currency\":\"EUR\"}", http.StatusBadRequest, "UTF-8"},
		{"900 KB currency", `{"customerId":"c","amountCents":1,"currency":"` + strings.Repeat("E", 900<<10) + `"}`, http.StatusUnprocessableEntity, "(921600 bytes)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := a.do(t, http.MethodPost, "/orders", tt.body)
			if rec.Code != tt.status {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tt.status, rec.Body)
			}
			body := decode[httpserver.ErrorBody](t, rec)
			if !strings.Contains(body.Error.Message, tt.want) {
				t.Fatalf("message = %q, want it to mention %q", body.Error.Message, tt.want)
			}
			if rec.Body.Len() > 1024 {
				t.Fatalf("the error body is %d bytes: it echoes the input", rec.Body.Len())
			}
		})
	}
	if n := a.count(t, "SELECT count(*) FROM orders"); n != 0 {
		t.Fatalf("%d orders written by bad requests", n)
	}
	outboxtest.RequireNotEnqueued(t, a.pool, outboxtest.Match{})
}

// Headers the API stores (Idempotency-Key as the key, X-Request-Id as the
// events' correlation id) must not carry what Postgres refuses into a 500.
func TestHeadersPostgresWouldRefuse(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, key := range []string{"k\xff\xfe", "k\x00y"} {
		rec := a.do(t, http.MethodPost, "/orders", validOrder, "Idempotency-Key", key)
		if rec.Code != http.StatusBadRequest {
			t.Fatalf("Idempotency-Key %q: status %d, want 400; body %s", key, rec.Code, rec.Body)
		}
	}
	if n := a.count(t, "SELECT count(*) FROM orders"); n != 0 {
		t.Fatalf("%d orders written with a bad Idempotency-Key", n)
	}
	rec := a.do(t, http.MethodPost, "/orders", validOrder, "X-Request-Id", "r\xff\x00")
	if rec.Code != http.StatusCreated {
		t.Fatalf("an unusable X-Request-Id: status %d, want 201 (a new id replaces it); body %s", rec.Code, rec.Body)
	}
	id := rec.Header().Get("X-Request-Id")
	correlation := outboxtest.RequireEnqueued(t, a.pool, outboxtest.Match{}).CorrelationID
	if id == "" || correlation != id {
		t.Fatalf("correlation id %q, response X-Request-Id %q: want the generated id in both", correlation, id)
	}
}

func TestIdempotencyKeyReturnsTheOriginalOrder(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	first := a.do(t, http.MethodPost, "/orders", validOrder, "Idempotency-Key", "k-1")
	again := a.do(t, http.MethodPost, "/orders", validOrder, "Idempotency-Key", "k-1")
	if first.Code != http.StatusCreated || again.Code != http.StatusOK {
		t.Fatalf("statuses %d then %d, want 201 then 200", first.Code, again.Code)
	}
	if again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("the replay is not marked Idempotent-Replayed")
	}
	if decode[orders.Order](t, first).ID != decode[orders.Order](t, again).ID {
		t.Fatal("the retry created another order")
	}
	other := a.do(t, http.MethodPost, "/orders", `{"customerId":"cust-1","amountCents":5,"currency":"EUR"}`, "Idempotency-Key", "k-1")
	if other.Code != http.StatusConflict {
		t.Fatalf("same key, other body: status %d, want 409", other.Code)
	}
	if n := a.count(t, "SELECT count(*) FROM orders"); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	outboxtest.RequireEnqueued(t, a.pool, outboxtest.Match{})
	if got := testinfra.MetricValue(t, a.reg, "orders_placed_total"); got != 1 {
		t.Fatalf("orders_placed_total = %v after one order and its replay, want 1", got)
	}
}

func TestCancelEmitsOrderCancelledOnce(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	o := decode[orders.Order](t, a.do(t, http.MethodPost, "/orders", validOrder))
	for i := range 2 {
		rec := a.do(t, http.MethodPost, "/orders/"+o.ID.String()+"/cancel", "")
		if rec.Code != http.StatusOK {
			t.Fatalf("cancel %d: status %d: %s", i, rec.Code, rec.Body)
		}
		c := decode[orders.Order](t, rec)
		if c.Status != orders.StatusCancelled || c.Version != 2 {
			t.Fatalf("cancel %d: order = %+v", i, c)
		}
	}
	outboxtest.RequireEnqueued(t, a.pool, outboxtest.Match{EventType: orders.EventOrderCancelled, AggregateVersion: 2})
	if got := testinfra.MetricValue(t, a.reg, "orders_cancelled_total"); got != 1 {
		t.Fatalf("orders_cancelled_total = %v after cancelling twice, want 1", got)
	}
	for path, want := range map[string]int{
		"/orders/8f14e45f-ceea-467f-a0e6-1bde3ba4a5d1/cancel": http.StatusNotFound,
		"/orders/not-a-uuid/cancel":                           http.StatusBadRequest,
	} {
		if rec := a.do(t, http.MethodPost, path, ""); rec.Code != want {
			t.Fatalf("POST %s: status %d, want %d", path, rec.Code, want)
		}
	}
	if rec := a.do(t, http.MethodGet, "/orders/8f14e45f-ceea-467f-a0e6-1bde3ba4a5d1", ""); rec.Code != http.StatusNotFound {
		t.Fatalf("GET unknown order: status %d, want 404", rec.Code)
	}
}

// POST /orders takes one JSON reading of the body: a key given twice (which
// encoding/json resolves silently, the last one winning) and a body declared
// as something else than JSON are refused with what is wrong, and nothing is
// written.
func TestPlaceRefusesDuplicateKeysAndNonJSONContentTypes(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, tt := range []struct {
		name, contentType, body string
		status                  int
		code, message           string
	}{
		{"duplicate key", "application/json", `{"customerId":"cust-1","amountCents":1999,"amountCents":1,"currency":"EUR"}`,
			http.StatusBadRequest, "malformed", `field "amountCents" appears twice`},
		{"text/plain", "text/plain", validOrder, http.StatusUnsupportedMediaType, "unsupported_media_type", `Content-Type must be application/json, got "text/plain"`},
		{"a form", "application/x-www-form-urlencoded", validOrder, http.StatusUnsupportedMediaType, "unsupported_media_type", "application/json"},
	} {
		rec := a.do(t, http.MethodPost, "/orders", tt.body, "Content-Type", tt.contentType)
		var body httpserver.ErrorBody
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != tt.status || body.Error.Code != tt.code || !strings.Contains(body.Error.Message, tt.message) {
			t.Errorf("%s: %d %s, want %d %s %q", tt.name, rec.Code, rec.Body, tt.status, tt.code, tt.message)
		}
	}
	for _, ct := range []string{"application/json; charset=utf-8", "application/json"} {
		if rec := a.do(t, http.MethodPost, "/orders", validOrder, "Content-Type", ct); rec.Code != http.StatusCreated {
			t.Errorf("Content-Type %q: %d %s, want 201", ct, rec.Code, rec.Body)
		}
	}
	if n := a.count(t, `SELECT count(*) FROM orders`); n != 2 {
		t.Fatalf("%d orders written, want only the 2 accepted", n)
	}
}
