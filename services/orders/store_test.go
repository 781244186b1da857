package orders_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/logging"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/orders"
)

func migratedDatabase(t *testing.T) string {
	t.Helper()
	return testinfra.NewMigratedDatabase(t, orders.Schema...)
}

func newOrder() orders.Order {
	now := time.Now().UTC()
	return orders.Order{ID: uuid.New(), CustomerID: "c-1", AmountCents: 100, Currency: "EUR",
		Status: orders.StatusPlaced, Version: 1, CreatedAt: now, UpdatedAt: now}
}

// The store answers with its named errors, never with pgx's: what is
// missing, what is already recorded, what the database refuses, and an
// outage, each recognisable with errors.Is.
func TestStoreNamesDriverErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := orders.NewStore(testinfra.NewPool(t, migratedDatabase(t)))

	_, err := store.Order(ctx, uuid.New())
	if !errors.Is(err, orders.ErrNotFound) || errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("a missing order: %v, want ErrNotFound and no pgx.ErrNoRows", err)
	}
	if _, _, err := store.IdempotencyKey(ctx, "never-sent"); !errors.Is(err, orders.ErrNotFound) {
		t.Fatalf("a missing key: %v, want ErrNotFound", err)
	}
	err = store.InTx(ctx, func(tx pgx.Tx) error { return store.UpdateOrder(ctx, tx, newOrder()) })
	if !errors.Is(err, orders.ErrNotFound) {
		t.Fatalf("updating a missing order: %v, want ErrNotFound", err)
	}

	o := newOrder()
	place := func(o orders.Order, key string) error {
		return store.InTx(ctx, func(tx pgx.Tx) error {
			if err := store.InsertOrder(ctx, tx, o); err != nil {
				return err
			}
			return store.InsertIdempotencyKey(ctx, tx, key, []byte("hash"), o.ID)
		})
	}
	if err := place(o, "key-1"); err != nil {
		t.Fatal(err)
	}
	if got, err := store.Order(ctx, o.ID); err != nil || got.ID != o.ID || got.Status != orders.StatusPlaced {
		t.Fatalf("Order = %+v, %v", got, err)
	}
	second := newOrder()
	if err := place(second, "key-1"); !errors.Is(err, orders.ErrDuplicate) {
		t.Fatalf("the same key again: %v, want ErrDuplicate", err)
	}
	if _, err := store.Order(ctx, second.ID); !errors.Is(err, orders.ErrNotFound) {
		t.Fatalf("the order of a duplicate key committed: %v", err)
	}

	bad := newOrder()
	bad.Currency = "EURO" // char(3): 22001, string data right truncation
	err = store.InTx(ctx, func(tx pgx.Tx) error { return store.InsertOrder(ctx, tx, bad) })
	if !errors.Is(err, orders.ErrInvalidData) || errors.Is(err, orders.ErrUnavailable) {
		t.Fatalf("a value Postgres refuses: %v, want ErrInvalidData", err)
	}
}

func TestStoreNamesAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, proxy := testinfra.ProxyDatabase(t, migratedDatabase(t))
	pool := testinfra.NewPool(t, url)
	store := orders.NewStore(pool)
	if _, err := store.Order(ctx, uuid.New()); !errors.Is(err, orders.ErrNotFound) {
		t.Fatalf("through the proxy: %v, want ErrNotFound", err)
	}
	proxy.Cut()
	_, err := store.Order(ctx, uuid.New())
	if !errors.Is(err, orders.ErrUnavailable) {
		t.Fatalf("with the database cut off: %v, want ErrUnavailable", err)
	}
	if ae, ok := apperr.As(err); !ok || ae.Code != apperr.Unavailable {
		t.Fatalf("ErrUnavailable is not an apperr.Unavailable: %v", err)
	}
	err = store.InTx(ctx, func(tx pgx.Tx) error { return store.InsertOrder(ctx, tx, newOrder()) })
	if !errors.Is(err, orders.ErrUnavailable) {
		t.Fatalf("a transaction with the database cut off: %v, want ErrUnavailable", err)
	}
	pool.Close()
	if _, err := store.Order(ctx, uuid.New()); !errors.Is(err, orders.ErrUnavailable) {
		t.Fatalf("on a closed pool: %v, want ErrUnavailable", err)
	}
}

// The API's error bodies: 404 and 409 say what is wrong with the request;
// 503 says to retry and gives the request id; none carries SQL, a SQLSTATE,
// a host or a driver message, which stay in the log.
func TestAPIErrorBodiesCarryNoInternals(t *testing.T) {
	t.Parallel()
	url, proxy := testinfra.ProxyDatabase(t, migratedDatabase(t))
	pool := testinfra.NewPool(t, url)
	var log strings.Builder
	logger, _ := logging.New(&log, "orders-test", "info")
	e := httpserver.New(httpserver.Config{Logger: logger, Gatherer: prometheus.NewRegistry()})
	orders.Routes(e, orders.New(pool, orders.Options{}))
	a := &api{e: e, pool: pool}

	if rec := a.do(t, http.MethodPost, "/orders", validOrder, "Idempotency-Key", "k-1"); rec.Code != http.StatusCreated {
		t.Fatalf("placing: %d %s", rec.Code, rec.Body)
	}
	missing := uuid.NewString()
	for _, tt := range []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code, want               string
	}{
		{"unknown order", http.MethodGet, "/orders/" + missing, "", nil, http.StatusNotFound, "not_found", "order " + missing + " does not exist"},
		{"cancel an unknown order", http.MethodPost, "/orders/" + missing + "/cancel", "", nil, http.StatusNotFound, "not_found", "does not exist"},
		{"key reused with another body", http.MethodPost, "/orders", `{"customerId":"c-2","amountCents":5,"currency":"EUR"}`,
			[]string{"Idempotency-Key", "k-1"}, http.StatusConflict, "conflict", "already used with a different request"},
	} {
		rec := a.do(t, tt.method, tt.path, tt.body, tt.headers...)
		requireErrorBody(t, tt.name, rec.Code, rec.Body.String(), tt.status, tt.code, tt.want)
	}

	proxy.Cut()
	for _, tt := range []struct{ method, path, body string }{
		{http.MethodGet, "/orders/" + missing, ""},
		{http.MethodPost, "/orders", validOrder},
		{http.MethodPost, "/orders/" + missing + "/cancel", ""},
	} {
		rec := a.do(t, tt.method, tt.path, tt.body, "X-Request-Id", "req-outage")
		body := requireErrorBody(t, tt.method+" "+tt.path+" in an outage", rec.Code, rec.Body.String(),
			http.StatusServiceUnavailable, "unavailable", "retry later")
		if body.Error.RequestID != "req-outage" || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("503 without the request id or Retry-After: %s %v", rec.Body, rec.Header())
		}
	}
	if !strings.Contains(log.String(), "req-outage") || !strings.Contains(log.String(), proxy.Addr()) {
		t.Fatalf("the log lacks the outage's cause under the request id:\n%s", log.String())
	}
}

func requireErrorBody(t *testing.T, what string, status int, raw string, wantStatus int, code, want string) httpserver.ErrorBody {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("%s: status %d, want %d; body %s", what, status, wantStatus, raw)
	}
	var body httpserver.ErrorBody
	if err := json.Unmarshal([]byte(raw), &body); err != nil {
		t.Fatalf("%s: body %q: %v", what, raw, err)
	}
	if body.Error.Code != code || !strings.Contains(body.Error.Message, want) {
		t.Fatalf("%s: body %s, want code %s mentioning %q", what, raw, code, want)
	}
	for _, internal := range []string{"SQLSTATE", "pgx", "pgconn", "SELECT", "INSERT", "127.0.0.1", "dial", "closed pool", "connection refused"} {
		if strings.Contains(raw, internal) {
			t.Fatalf("%s: the body leaks %q: %s", what, internal, raw)
		}
	}
	return body
}

// PlaceInPipeline commits the order, its key and its event together, in one
// or two round trips, or none of them: a key already recorded (ErrDuplicate), a
// refusal before the commit, a failing event insert and a value Postgres
// refuses each leave nothing behind, and the connection goes back to the
// pool clean (a pool of one connection serves every step).
func TestPlaceInPipelineCommitsAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t, migratedDatabase(t)+"&pool_max_conns=1")
	store := orders.NewStore(pool)
	count := func(query string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventOf := func(o orders.Order) event.Envelope {
		return event.Envelope{EventID: event.NewID(), EventType: orders.EventOrderPlaced, EventVersion: 1,
			AggregateType: orders.AggregateType, AggregateID: o.ID.String(), AggregateVersion: 1,
			OccurredAt: o.CreatedAt, Payload: []byte(`{}`)}
	}
	place := func(o orders.Order, key string, evs []event.Envelope, beforeCommit func() error) error {
		got, err := store.PlaceInPipeline(ctx, key, []byte("hash"), func() (orders.Order, func(*pgx.Batch) error, error) {
			return o, func(b *pgx.Batch) error { return outbox.Queue(b, evs...) }, nil
		}, beforeCommit)
		if err == nil && got.ID != o.ID {
			t.Fatalf("PlaceInPipeline returned order %v, want %v", got.ID, o.ID)
		}
		return err
	}
	none := func() error { return nil }

	first := newOrder()
	firstEvent := eventOf(first)
	if err := place(first, "key-1", []event.Envelope{firstEvent}, none); err != nil {
		t.Fatal(err)
	}
	if _, id, err := store.IdempotencyKey(ctx, "key-1"); err != nil || id != first.ID {
		t.Fatalf("the key records %v, %v; want %v", id, err, first.ID)
	}

	steps := []struct {
		name         string
		o            orders.Order
		key          string
		evs          func(orders.Order) []event.Envelope
		beforeCommit func() error
		want         error
	}{
		{"the same key again", newOrder(), "key-1", func(o orders.Order) []event.Envelope { return []event.Envelope{eventOf(o)} }, none, orders.ErrDuplicate},
		{"refused before the commit", newOrder(), "key-2", func(o orders.Order) []event.Envelope { return []event.Envelope{eventOf(o)} },
			func() error { return errCrash }, errCrash},
		// The event id is taken: a unique violation of the outbox's, which
		// must not read as a seen idempotency key.
		{"a failing event insert", newOrder(), "key-3", func(orders.Order) []event.Envelope { return []event.Envelope{firstEvent} }, none, nil},
		{"a value Postgres refuses", func() orders.Order { o := newOrder(); o.Currency = "EURO"; return o }(), "",
			func(o orders.Order) []event.Envelope { return []event.Envelope{eventOf(o)} }, none, orders.ErrInvalidData},
		// Without a key, one round trip: the same outcomes.
		{"refused before the commit, no key", newOrder(), "", func(o orders.Order) []event.Envelope { return []event.Envelope{eventOf(o)} },
			func() error { return errCrash }, errCrash},
		{"a failing event insert, no key", newOrder(), "", func(orders.Order) []event.Envelope { return []event.Envelope{firstEvent} }, none, nil},
	}
	for _, s := range steps {
		err := place(s.o, s.key, s.evs(s.o), s.beforeCommit)
		switch {
		case err == nil:
			t.Fatalf("%s: committed", s.name)
		case s.want != nil && !errors.Is(err, s.want):
			t.Fatalf("%s: %v, want %v", s.name, err, s.want)
		case s.want == nil && errors.Is(err, orders.ErrDuplicate):
			t.Fatalf("%s: %v reads as a seen idempotency key", s.name, err)
		}
	}
	if o, k, e := count(`SELECT count(*) FROM orders`), count(`SELECT count(*) FROM idempotency_keys`),
		count(`SELECT count(*) FROM outbox_events`); o != 1 || k != 1 || e != 1 {
		t.Fatalf("after the failed steps: %d orders, %d keys, %d events; want only the first of each", o, k, e)
	}
	if err := place(newOrder(), "", nil, none); err != nil {
		t.Fatalf("an order without a key or an event, after the failures: %v", err)
	}
	if n := count(`SELECT count(*) FROM orders`); n != 2 {
		t.Fatalf("%d orders, want 2", n)
	}
}

var errCrash = errors.New("crash point")
