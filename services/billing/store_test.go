package billing_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/pgerr"
	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/billing"
)

func billingDatabase(t *testing.T) string {
	t.Helper()
	return testinfra.NewMigratedDatabase(t, billing.Schema...)
}

func captured(orderID uuid.UUID) billing.Charge {
	return billing.Charge{OrderID: orderID, PaymentID: uuid.New(), CustomerID: "c-1", AmountCents: 500, Currency: "EUR",
		Status: billing.StatusCaptured, Version: 1, CapturedAt: time.Now().UTC()}
}

// The store answers with its named errors, never with pgx's.
func TestStoreNamesDriverErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testinfra.NewPool(t, billingDatabase(t))
	store := billing.NewStore(pool)
	inTx := func(fn func(tx pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, fn) }

	_, err := store.Charge(ctx, uuid.New())
	if !errors.Is(err, billing.ErrNotFound) || errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("a missing charge: %v, want ErrNotFound and no pgx.ErrNoRows", err)
	}
	err = inTx(func(tx pgx.Tx) error {
		_, err := store.RefundCharge(ctx, tx, uuid.New(), time.Now())
		return err
	})
	if !errors.Is(err, billing.ErrNotFound) {
		t.Fatalf("refunding a missing charge: %v, want ErrNotFound", err)
	}

	c := captured(uuid.New())
	insert := func(c billing.Charge) (inserted bool, err error) {
		err = inTx(func(tx pgx.Tx) error {
			inserted, err = store.InsertCharge(ctx, tx, c)
			return err
		})
		return inserted, err
	}
	if ok, err := insert(c); !ok || err != nil {
		t.Fatalf("first charge: inserted=%v, %v", ok, err)
	}
	// The same order again is absorbed, not an error.
	if ok, err := insert(captured(c.OrderID)); ok || err != nil {
		t.Fatalf("the order charged again: inserted=%v, %v; want false, nil", ok, err)
	}
	other := captured(uuid.New())
	other.PaymentID = c.PaymentID
	if _, err := insert(other); !errors.Is(err, billing.ErrDuplicate) {
		t.Fatalf("another order under the same payment id: %v, want ErrDuplicate", err)
	}
	bad := captured(uuid.New())
	bad.Currency = "EURO" // char(3): 22001, string data right truncation
	if _, err := insert(bad); !errors.Is(err, billing.ErrInvalidData) || !pgerr.IsPermanent(err) {
		t.Fatalf("a value Postgres refuses: %v, want ErrInvalidData with the cause the inbox dead-letters on", err)
	}

	err = inTx(func(tx pgx.Tx) error {
		r, err := store.RefundCharge(ctx, tx, c.OrderID, time.Now())
		if err == nil && (r.Status != billing.StatusRefunded || r.Version != 2 || r.PaymentID != c.PaymentID) {
			t.Errorf("refunded charge = %+v", r)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = inTx(func(tx pgx.Tx) error {
		_, err := store.RefundCharge(ctx, tx, c.OrderID, time.Now())
		if !errors.Is(err, billing.ErrNotFound) {
			t.Errorf("refunding twice: %v, want ErrNotFound", err)
		}
		status, err := store.ChargeStatus(ctx, tx, c.OrderID)
		if status != billing.StatusRefunded {
			t.Errorf("status = %q, want refunded", status)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// An outage is ErrUnavailable, with the cause the inbox waits out, and the
// read API answers 503 without internals; a missing charge is a 404.
func TestOutageAndMissingChargeOverHTTP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, proxy := testinfra.ProxyDatabase(t, billingDatabase(t))
	pool := testinfra.NewPool(t, url)
	var log strings.Builder
	e := httpserver.New(httpserver.Config{Logger: slog.New(slog.NewTextHandler(&log, nil)), Gatherer: prometheus.NewRegistry()})
	billing.Routes(e, billing.New(pool, slog.New(slog.NewTextHandler(io.Discard, nil)), nil))
	get := func(path string) (*httptest.ResponseRecorder, httpserver.ErrorBody) {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set(apperr.RequestIDHeader, "req-b")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		var body httpserver.ErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("GET %s: body %q: %v", path, rec.Body, err)
		}
		for _, internal := range []string{"SQLSTATE", "pgx", "no rows", "SELECT", "127.0.0.1", "dial", "EOF", "refused"} {
			if strings.Contains(rec.Body.String(), internal) {
				t.Fatalf("GET %s: the body leaks %q: %s", path, internal, rec.Body)
			}
		}
		return rec, body
	}
	missing := uuid.NewString()
	if rec, body := get("/charges/" + missing); rec.Code != http.StatusNotFound || body.Error.Code != "not_found" ||
		!strings.Contains(body.Error.Message, missing) {
		t.Fatalf("a missing charge: %d %s", rec.Code, rec.Body)
	}

	proxy.Cut()
	if _, err := billing.NewStore(pool).Charge(ctx, uuid.New()); !errors.Is(err, billing.ErrUnavailable) || !pgerr.IsUnavailable(err) {
		t.Fatalf("a read in an outage: %v, want ErrUnavailable with the cause the inbox waits out", err)
	}
	rec, body := get("/charges/" + missing)
	if rec.Code != http.StatusServiceUnavailable || body.Error.Code != "unavailable" || body.Error.RequestID != "req-b" ||
		!strings.Contains(body.Error.Message, "retry later") {
		t.Fatalf("a read in an outage: %d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(log.String(), "req-b") || !strings.Contains(log.String(), proxy.Addr()) {
		t.Fatalf("the log lacks the outage's cause under the request id:\n%s", log.String())
	}
}
