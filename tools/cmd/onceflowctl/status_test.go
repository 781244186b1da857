package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// The stand-in's duplicate bookings make the platform "failing", in text
// and JSON, read from the real stand-in's operator /metrics; a clean ledger
// is "ok". Before, status read only the three services and said "ok".
func TestStatusSaysFailingWhenTheThirdPartyBookedTwice(t *testing.T) {
	t.Parallel()
	ledger, err := thirdparty.OpenLedger(filepath.Join(t.TempDir(), "ledger.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	servers, err := thirdparty.NewServer(ledger, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(),
		thirdparty.AdminOptions{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	public, admin := httptest.NewServer(servers.Public), httptest.NewServer(servers.Admin)
	t.Cleanup(public.Close)
	t.Cleanup(admin.Close)
	// The three services answer with healthy, connected gauges.
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "outbox_pending_events 0\noutbox_kafka_connected 1\ninbox_kafka_connected{consumer=\"c\"} 1\n")
	}))
	t.Cleanup(healthy.Close)
	env := map[string]string{"ADMIN_TOKEN": token, "ONCEFLOW_ORDERS_ADMIN": healthy.URL, "ONCEFLOW_BILLING_ADMIN": healthy.URL,
		"ONCEFLOW_SHIM_ADMIN": healthy.URL, "ONCEFLOW_RECONCILER_ADMIN": admin.URL}

	out, err := ctl(t, env, "status")
	if err != nil || !strings.HasSuffix(strings.TrimSpace(out), "verdict: ok") {
		t.Fatalf("clean ledger: %v\n%s", err, out)
	}
	client := thirdparty.NewClient(public.URL, nil)
	req := thirdparty.SettleRequest{PaymentID: "p-1", OrderID: "o-1", Kind: thirdparty.KindCapture, AmountCents: 100, Currency: "EUR"}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := client.Settle(ctx, "key-1", req)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	out, err = ctl(t, env, "status")
	if err == nil || !strings.Contains(out, "1 payment(s) booked twice") || !strings.HasSuffix(strings.TrimSpace(out), "verdict: failing") {
		t.Fatalf("after a duplicate booking: err = %v, want failing with the duplicate named:\n%s", err, out)
	}
	out, _ = ctl(t, env, "-o", "json", "status")
	var rep StatusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Verdict != "failing" || len(rep.Services) != 4 ||
		rep.Services[3].DuplicateSettlements == nil || *rep.Services[3].DuplicateSettlements != 1 ||
		rep.Services[0].KafkaConnected == nil || *rep.Services[0].KafkaConnected != 1 {
		t.Fatalf("status -o json = %s (%v)", out, err)
	}
}

// A requeue of named ids that the service did not requeue (not dead letters:
// unknown, already requeued, uncertain) fails and says why, instead of
// printing "requeued 0" and exiting 0; -h on dead-letters prints the usage.
func TestRequeueOfIdsThatAreNotDeadLettersFails(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"requeued": 0}`)
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"ADMIN_TOKEN": token, "ONCEFLOW_SHIM_ADMIN": srv.URL}
	out, err := ctl(t, env, "dead-letters", "requeue", "-service", "shim", "-event-ids", "6f1c8a4e-1d2b-4c3d-9e8f-0a1b2c3d4e5f")
	if err == nil || !strings.Contains(err.Error(), "requeued 0 of the 1 named") || !strings.Contains(out, "requeued 0") {
		t.Fatalf("err = %v, out = %q: want a failure that names what was not requeued", err, out)
	}
	if out, err := ctl(t, env, "dead-letters", "requeue", "-service", "shim", "-all"); err != nil {
		t.Fatalf("-all with nothing to requeue is not an error: %v\n%s", err, out)
	}
	if out, _ := ctl(t, env, "dead-letters", "-h"); !strings.Contains(out, "usage: onceflowctl dead-letters") {
		t.Fatalf("dead-letters -h = %q", out)
	}
}
