package thirdparty_test

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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// api is one stand-in reconciler served over real HTTP for a test.
type api struct {
	ledger   *thirdparty.Ledger
	client   *thirdparty.Client
	url      string
	adminURL string
	reg      *prometheus.Registry
}

const testToken = "test-token"

func newAPI(t *testing.T) *api {
	t.Helper()
	l := openLedger(t, "")
	reg := prometheus.NewRegistry()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))
	s, err := thirdparty.NewServer(l, logger, reg, thirdparty.AdminOptions{Token: testToken})
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	srv, admin := httptest.NewServer(s.Public), httptest.NewServer(s.Admin)
	t.Cleanup(srv.Close)
	t.Cleanup(admin.Close)
	return &api{ledger: l, client: thirdparty.NewClient(srv.URL, srv.Client()).WithAdmin(admin.URL, testToken),
		url: srv.URL, adminURL: admin.URL, reg: reg}
}

func capture(paymentID string) thirdparty.SettleRequest {
	return thirdparty.SettleRequest{
		PaymentID: paymentID, OrderID: "ord-1", Kind: thirdparty.KindCapture, AmountCents: 4200, Currency: "EUR",
	}
}

// getJSON fetches path and decodes the body into out, returning the status.
func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("GET %s: decoding body: %v", url, err)
	}
	return resp.StatusCode
}

func TestSettleBooksEveryRequestEvenWithTheSameKey(t *testing.T) {
	a := newAPI(t)
	ctx := t.Context()

	first, err := a.client.Settle(ctx, "pay-1:capture", capture("pay-1"))
	if err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if first.ID == "" || first.IdempotencyKey != "pay-1:capture" || first.AmountCents != 4200 || first.ReceivedAt.IsZero() {
		t.Fatalf("Settle returned %+v, want the stored settlement", first)
	}
	if _, err := a.client.Settle(ctx, "pay-1:capture", capture("pay-1")); err != nil {
		t.Fatalf("second Settle: %v (the third party is not idempotent: it must book again)", err)
	}

	var stats thirdparty.Stats
	if code := getJSON(t, a.url+"/stats", &stats); code != http.StatusOK {
		t.Fatalf("GET /stats = %d", code)
	}
	if want := (thirdparty.Stats{Settlements: 2, UniqueKeys: 1, Duplicates: 1, Captures: 2}); stats != want {
		t.Fatalf("GET /stats = %+v, want %+v", stats, want)
	}
	var all []thirdparty.Settlement
	if code := getJSON(t, a.url+"/settlements", &all); code != http.StatusOK || len(all) != 2 {
		t.Fatalf("GET /settlements = %d with %d settlements, want 200 with 2", code, len(all))
	}
	var byKey []thirdparty.Settlement
	if code := getJSON(t, a.url+"/settlements/pay-1:capture", &byKey); code != http.StatusOK || len(byKey) != 2 {
		t.Fatalf("GET /settlements/pay-1:capture = %d with %d settlements, want 200 with 2", code, len(byKey))
	}

	const want = `
# HELP reconciler_duplicate_settlements_total Settlements booked under an idempotency key that already had one.
# TYPE reconciler_duplicate_settlements_total counter
reconciler_duplicate_settlements_total 1
# HELP reconciler_settlements_total Settlements the third-party reconciler booked, duplicates included.
# TYPE reconciler_settlements_total counter
reconciler_settlements_total{kind="capture"} 2
reconciler_settlements_total{kind="refund"} 0
`
	if err := testutil.GatherAndCompare(a.reg, strings.NewReader(want), "reconciler_duplicate_settlements_total", "reconciler_settlements_total"); err != nil {
		t.Fatal(err)
	}
}

func TestListIsAnEmptyArrayWhenNothingIsBooked(t *testing.T) {
	a := newAPI(t)
	resp, err := http.Get(a.url + "/settlements")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if got := strings.TrimSpace(string(body)); resp.StatusCode != http.StatusOK || got != "[]" {
		t.Fatalf("GET /settlements = %d %s, want 200 []", resp.StatusCode, got)
	}
}

func TestSettleRejectsInvalidRequests(t *testing.T) {
	valid := `{"paymentId":"p1","orderId":"o1","kind":"capture","amountCents":100,"currency":"EUR"}`
	tests := []struct {
		name       string
		key        string
		body       string
		wantStatus int
		wantCode   string
		wantInMsg  string
	}{
		{"no idempotency key", "", valid, 400, "malformed", "Idempotency-Key"},
		{"blank idempotency key", "  ", valid, 400, "malformed", "Idempotency-Key"},
		{"not json", "k", `paymentId=p1`, 400, "malformed", "JSON"},
		{"empty body", "k", ``, 400, "malformed", "JSON"},
		{"unknown field", "k", `{"paymentId":"p1","orderId":"o1","kind":"capture","amount":100,"currency":"EUR"}`, 400, "malformed", "amount"},
		{"fractional amount", "k", `{"paymentId":"p1","orderId":"o1","kind":"capture","amountCents":1.5,"currency":"EUR"}`, 400, "malformed", "amountCents"},
		{"trailing data", "k", valid + `{}`, 400, "malformed", "after"},
		{"missing payment id", "k", `{"orderId":"o1","kind":"capture","amountCents":100,"currency":"EUR"}`, 422, "invalid", "paymentId"},
		{"missing order id", "k", `{"paymentId":"p1","kind":"capture","amountCents":100,"currency":"EUR"}`, 422, "invalid", "orderId"},
		{"unknown kind", "k", `{"paymentId":"p1","orderId":"o1","kind":"chargeback","amountCents":100,"currency":"EUR"}`, 422, "invalid", "kind"},
		{"zero amount", "k", `{"paymentId":"p1","orderId":"o1","kind":"capture","amountCents":0,"currency":"EUR"}`, 422, "invalid", "amountCents"},
		{"negative amount", "k", `{"paymentId":"p1","orderId":"o1","kind":"refund","amountCents":-5,"currency":"EUR"}`, 422, "invalid", "amountCents"},
		{"lower-case currency", "k", `{"paymentId":"p1","orderId":"o1","kind":"capture","amountCents":100,"currency":"eur"}`, 422, "invalid", "currency"},
		{"long currency", "k", `{"paymentId":"p1","orderId":"o1","kind":"capture","amountCents":100,"currency":"EURO"}`, 422, "invalid", "currency"},
		{"key too long", strings.Repeat("k", thirdparty.MaxKeyLength+1), valid, 422, "invalid", "Idempotency-Key"},
		{"every problem at once", "k", `{"kind":"x","currency":"?"}`, 422, "invalid", "paymentId is required; orderId is required; kind"},
	}
	a := newAPI(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, a.url+"/settlements", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			if tt.key != "" {
				req.Header.Set(thirdparty.IdempotencyKeyHeader, tt.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body httpserver.ErrorBody
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("error body is not JSON: %v", err)
			}
			if resp.StatusCode != tt.wantStatus || body.Error.Code != tt.wantCode || !strings.Contains(body.Error.Message, tt.wantInMsg) {
				t.Fatalf("got %d %+v, want %d %s mentioning %q", resp.StatusCode, body.Error, tt.wantStatus, tt.wantCode, tt.wantInMsg)
			}
		})
	}
	if got := a.ledger.Stats().Settlements; got != 0 {
		t.Fatalf("%d invalid requests were booked", got)
	}
}

func TestClientMarksClientErrorsRejected(t *testing.T) {
	a := newAPI(t)
	req := capture("p1")
	req.AmountCents = 0
	_, err := a.client.Settle(t.Context(), "k", req)
	if !errors.Is(err, thirdparty.ErrRejected) {
		t.Fatalf("Settle(invalid) = %v, want an error wrapping ErrRejected", err)
	}
	var se *thirdparty.StatusError
	if !errors.As(err, &se) || se.StatusCode != 422 || se.Code != "invalid" || !strings.Contains(err.Error(), "amountCents must be positive") {
		t.Fatalf("Settle(invalid) = %v, want a 422 StatusError naming the broken rule", err)
	}
}

func TestStatusErrorPermanence(t *testing.T) {
	tests := []struct {
		status   int
		rejected bool
	}{
		{400, true}, {404, true}, {409, true}, {422, true},
		{408, false}, {429, false}, {500, false}, {502, false}, {503, false},
	}
	for _, tt := range tests {
		err := error(&thirdparty.StatusError{StatusCode: tt.status, Message: "m"})
		if got := errors.Is(err, thirdparty.ErrRejected); got != tt.rejected {
			t.Errorf("status %d: errors.Is(err, ErrRejected) = %v, want %v", tt.status, got, tt.rejected)
		}
	}
}

func TestLookup(t *testing.T) {
	a := newAPI(t)
	ctx := t.Context()
	// Keys the shim builds can hold characters that need escaping in a path.
	for _, key := range []string{"pay-1:capture", "a/b c%d?e#f", "ünïcode"} {
		found, err := a.client.Lookup(ctx, key)
		if err != nil || found {
			t.Fatalf("Lookup(%q) before booking = %v, %v; want false, nil", key, found, err)
		}
		if _, err := a.client.Settle(ctx, key, capture("p")); err != nil {
			t.Fatal(err)
		}
		found, err = a.client.Lookup(ctx, key)
		if err != nil || !found {
			t.Fatalf("Lookup(%q) after booking = %v, %v; want true, nil", key, found, err)
		}
	}
}

func TestLookupDoesNotReadAWrongURLAsNotBooked(t *testing.T) {
	a := newAPI(t)
	c := thirdparty.NewClient(a.url+"/wrong-prefix", nil)
	found, err := c.Lookup(t.Context(), "k")
	if err == nil {
		t.Fatalf("Lookup against a wrong base URL = %v, nil; want an error, not \"not booked\"", found)
	}
}

func TestFailNextFailsWithoutBooking(t *testing.T) {
	a := newAPI(t)
	ctx := t.Context()
	if err := a.client.SetFaults(ctx, thirdparty.Faults{FailNext: 1}); err != nil {
		t.Fatal(err)
	}

	invalid := capture("p1")
	invalid.Currency = "euro"
	if _, err := a.client.Settle(ctx, "k0", invalid); !errors.Is(err, thirdparty.ErrRejected) {
		t.Fatalf("invalid Settle = %v, want a rejection that leaves the fault armed", err)
	}

	_, err := a.client.Settle(ctx, "k1", capture("p1"))
	var se *thirdparty.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusInternalServerError {
		t.Fatalf("Settle with failNext=1 = %v, want a 500 StatusError", err)
	}
	if errors.Is(err, thirdparty.ErrRejected) {
		t.Fatalf("a 500 must stay retryable, got %v", err)
	}
	if got := a.ledger.Stats().Settlements; got != 0 {
		t.Fatalf("a failed settlement was booked (%d settlements)", got)
	}
	if found, err := a.client.Lookup(ctx, "k1"); err != nil || found {
		t.Fatalf("Lookup(k1) after injected failure = %v, %v; want false, nil", found, err)
	}

	var left thirdparty.Faults
	req, _ := http.NewRequest(http.MethodGet, a.adminURL+"/admin/faults", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&left); err != nil {
		t.Fatal(err)
	}
	if left.FailNext != 0 {
		t.Fatalf("GET /admin/faults = %+v, want failNext used up", left)
	}
	if _, err := a.client.Settle(ctx, "k1", capture("p1")); err != nil {
		t.Fatalf("Settle after the fault is used up: %v", err)
	}
}

// A rejection is a 4xx the caller cannot retry past (ErrRejected, which the
// shim dead-letters), and nothing is booked; the next settlement goes through.
func TestRejectNextRejectsWithoutBooking(t *testing.T) {
	a := newAPI(t)
	ctx := t.Context()
	if err := a.client.SetFaults(ctx, thirdparty.Faults{RejectNext: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := a.client.Settle(ctx, "k1", capture("p1"))
	var se *thirdparty.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusUnprocessableEntity || !errors.Is(err, thirdparty.ErrRejected) {
		t.Fatalf("Settle with rejectNext=1 = %v, want a 422 that is ErrRejected", err)
	}
	if found, err := a.client.Lookup(ctx, "k1"); err != nil || found {
		t.Fatalf("Lookup(k1) after an injected rejection = %v, %v; want false, nil", found, err)
	}
	if _, err := a.client.Settle(ctx, "k1", capture("p1")); err != nil {
		t.Fatalf("Settle after the rejection is used up: %v", err)
	}
	if got := a.ledger.Stats().Settlements; got != 1 {
		t.Fatalf("%d settlements booked, want 1: the rejected one is not", got)
	}
}

// A booking that then errors: the settlement is booked and answered 422
// (ErrRejected, which the shim dead-letters), so a caller that asks before
// settling again finds it.
func TestBookRejectNextBooksThenRejects(t *testing.T) {
	a := newAPI(t)
	ctx := t.Context()
	if err := a.client.SetFaults(ctx, thirdparty.Faults{BookRejectNext: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := a.client.Settle(ctx, "k1", capture("p1"))
	if !errors.Is(err, thirdparty.ErrRejected) {
		t.Fatalf("Settle with bookRejectNext=1 = %v, want a 422 that is ErrRejected", err)
	}
	if found, err := a.client.Lookup(ctx, "k1"); err != nil || !found {
		t.Fatalf("Lookup(k1) after a booking that was rejected = %v, %v; want true, nil", found, err)
	}
	if got := a.ledger.Stats().Settlements; got != 1 {
		t.Fatalf("%d settlements booked, want 1", got)
	}
}

func TestHangNextBooksThenAnswersLate(t *testing.T) {
	a := newAPI(t)
	ctx := t.Context()
	const hang = 2 * time.Second
	if err := a.client.SetFaults(ctx, thirdparty.Faults{HangNext: 1, HangFor: hang.String()}); err != nil {
		t.Fatal(err)
	}

	impatient := thirdparty.NewClient(a.url, &http.Client{Timeout: 100 * time.Millisecond})
	_, err := impatient.Settle(ctx, "k1", capture("p1"))
	if err == nil || errors.Is(err, thirdparty.ErrRejected) {
		t.Fatalf("Settle against a hung third party = %v, want a retryable timeout", err)
	}
	// The outcome was unknown to the caller, but the third party booked it:
	// Lookup is how the shim avoids booking it a second time.
	found, err := a.client.Lookup(ctx, "k1")
	if err != nil || !found {
		t.Fatalf("Lookup(k1) after a timed-out Settle = %v, %v; want true, nil", found, err)
	}

	start := time.Now()
	if _, err := a.client.Settle(ctx, "k2", capture("p2")); err != nil {
		t.Fatalf("Settle after the hang is used up: %v", err)
	}
	if d := time.Since(start); d >= hang {
		t.Fatalf("Settle after the hang is used up took %v", d)
	}
}

func TestHangNextAnswersAfterTheDelay(t *testing.T) {
	a := newAPI(t)
	const hang = 200 * time.Millisecond
	if err := a.client.SetFaults(t.Context(), thirdparty.Faults{HangNext: 1, HangFor: hang.String()}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := a.client.Settle(t.Context(), "k1", capture("p1")); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if d := time.Since(start); d < hang {
		t.Fatalf("Settle answered after %v, want at least %v", d, hang)
	}
}

func TestSlowNextBooksOnlyWhatTheCallerWaitedFor(t *testing.T) {
	a := newAPI(t)
	ctx := t.Context()
	const slow = 300 * time.Millisecond
	if err := a.client.SetFaults(ctx, thirdparty.Faults{SlowNext: 2, SlowFor: slow.String()}); err != nil {
		t.Fatal(err)
	}
	// A caller that gives up during the wait leaves nothing booked: the
	// fault makes the third party slow, never the cause of a duplicate.
	impatient := thirdparty.NewClient(a.url, &http.Client{Timeout: 50 * time.Millisecond})
	if _, err := impatient.Settle(ctx, "k1", capture("p1")); err == nil {
		t.Fatal("Settle with a 50ms timeout against a 300ms third party succeeded")
	}
	start := time.Now()
	if _, err := a.client.Settle(ctx, "k2", capture("p2")); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if d := time.Since(start); d < slow {
		t.Fatalf("Settle answered after %v, want at least %v", d, slow)
	}
	// The handler of the abandoned call may still be finishing: wait for
	// the ledger to settle on its answer rather than read it once.
	deadline := time.Now().Add(5 * time.Second)
	for {
		found, err := a.client.Lookup(ctx, "k1")
		if err != nil {
			t.Fatal(err)
		}
		if found {
			t.Fatal("the settlement whose caller gave up during the wait was booked")
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(slow):
		}
		if time.Since(start) > 2*slow {
			break
		}
	}
	if found, err := a.client.Lookup(ctx, "k2"); err != nil || !found {
		t.Fatalf("Lookup(k2) = %v, %v; want the waited-for settlement booked", found, err)
	}
}

func TestSetFaultsValidates(t *testing.T) {
	tests := []struct {
		name string
		in   thirdparty.Faults
	}{
		{"negative failNext", thirdparty.Faults{FailNext: -1}},
		{"negative rejectNext", thirdparty.Faults{RejectNext: -1}},
		{"negative bookRejectNext", thirdparty.Faults{BookRejectNext: -1}},
		{"hangNext without hangFor", thirdparty.Faults{HangNext: 1}},
		{"bad duration", thirdparty.Faults{HangNext: 1, HangFor: "soon"}},
		{"negative duration", thirdparty.Faults{HangNext: 1, HangFor: "-1s"}},
		{"hang too long", thirdparty.Faults{HangNext: 1, HangFor: "24h"}},
		{"too many failures", thirdparty.Faults{FailNext: thirdparty.MaxFaultCount + 1}},
		{"slowNext without slowFor", thirdparty.Faults{SlowNext: 1}},
		{"slow too long", thirdparty.Faults{SlowNext: 1, SlowFor: "24h"}},
	}
	a := newAPI(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.client.SetFaults(t.Context(), tt.in)
			var se *thirdparty.StatusError
			if !errors.As(err, &se) || se.StatusCode != http.StatusUnprocessableEntity {
				t.Fatalf("SetFaults(%+v) = %v, want 422", tt.in, err)
			}
		})
	}
}

func TestNewServerNeedsAGatherer(t *testing.T) {
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"x": "y"}, prometheus.NewRegistry())
	logger := slog.New(slog.DiscardHandler)
	if _, err := thirdparty.NewServer(openLedger(t, ""), logger, reg, thirdparty.AdminOptions{}); err == nil {
		t.Fatal("NewServer accepted a registerer that /metrics cannot serve")
	}
}

func TestSettleHonoursContext(t *testing.T) {
	a := newAPI(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := a.client.Settle(ctx, "k", capture("p")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Settle with a cancelled context = %v, want context.Canceled", err)
	}
}

// The stand-in answers /readyz in the platform's one shape (each check's
// name with "ok" or its error), like the services, and counts its requests
// (http_requests_total) like them.
func TestReadyzHasThePlatformsShapeAndRequestsAreCounted(t *testing.T) {
	a := newAPI(t)
	var ready map[string]string
	if code := testinfra.GetJSON(t, a.url+"/readyz", &ready); code != http.StatusOK || ready["ledger"] != "ok" || len(ready) != 1 {
		t.Fatalf("/readyz = %d %v, want 200 {\"ledger\":\"ok\"}", code, ready)
	}
	if _, err := a.client.Lookup(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	if n := testinfra.LabeledMetricValue(t, a.reg, "http_requests_total",
		map[string]string{"route": "/settlements/:key", "method": "GET", "status_class": "4xx"}); n != 1 {
		t.Fatalf("http_requests_total for the look-up = %v, want 1", n)
	}
	if err := a.ledger.Close(); err != nil {
		t.Fatal(err)
	}
	if code := testinfra.GetJSON(t, a.url+"/readyz", &ready); code != http.StatusServiceUnavailable || ready["ledger"] == "ok" {
		t.Fatalf("/readyz with the ledger closed = %d %v, want 503 naming the ledger", code, ready)
	}
}
