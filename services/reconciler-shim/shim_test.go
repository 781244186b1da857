package shim_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
	shim "github.com/onceflow/onceflow/services/reconciler-shim"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// rig is the shim's database, a topic, and the stand-in third party.
type rig struct {
	pool     *pgxpool.Pool
	brokers  []string
	topic    string
	ledger   *thirdparty.Ledger
	url      string
	adminURL string
	quiet    *slog.Logger
	// metrics has the shim metrics of the consumer built last.
	metrics *prometheus.Registry
	// mode is how the third party's API answers now (see gate).
	mode atomic.Int32
}

// The modes of the third party's API in front of the stand-in.
const (
	apiUp int32 = iota
	// apiDown: every request is answered 503, as by a load balancer with
	// no healthy backend: the third party is down.
	apiDown
	// apiLookupLost: lookups are answered a bare 404 that is not the API's
	// own not_found (a proxy's, a wrong route): nobody can tell from it
	// whether the key was booked.
	apiLookupLost
)

// gate answers for the third party as r.mode says, and passes everything
// else to its API.
func (r *rig) gate(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch r.mode.Load() {
		case apiDown:
			http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
			return
		case apiLookupLost:
			if req.Method == http.MethodGet {
				http.Error(w, "404 page not found", http.StatusNotFound)
				return
			}
		}
		api.ServeHTTP(w, req)
	})
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{brokers: testinfra.KafkaBrokers(t), quiet: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r.pool = testinfra.NewPool(t, shimDatabase(t))
	r.topic = testinfra.NewTopic(t, r.brokers, 1)
	testinfra.NewTopicNamed(t, r.brokers, r.topic+".dlt", 1)
	var err error
	if r.ledger, err = thirdparty.OpenLedger(""); err != nil {
		t.Fatal(err)
	}
	srv, err := thirdparty.NewServer(r.ledger, r.quiet, prometheus.NewRegistry(), thirdparty.AdminOptions{Token: "test-token"})
	if err != nil {
		t.Fatal(err)
	}
	hs, admin := httptest.NewServer(r.gate(srv.Public)), httptest.NewServer(srv.Admin)
	t.Cleanup(hs.Close)
	t.Cleanup(admin.Close)
	r.url, r.adminURL = hs.URL, admin.URL
	return r
}

func (r *rig) publish(t *testing.T, evs ...event.Envelope) {
	t.Helper()
	w := kafkautil.NewWriter(r.brokers, 10)
	defer w.Close()
	for _, ev := range evs {
		if err := w.WriteMessages(context.Background(), event.ToKafka(r.topic, ev)); err != nil {
			t.Fatal(err)
		}
	}
}

// consumer builds the shim's lease-mode consumer on a group, with a client
// whose calls time out after callTimeout.
func (r *rig) consumer(t *testing.T, group string, callTimeout time.Duration, cfg lease.Config) *inbox.Consumer {
	t.Helper()
	w := kafkautil.NewWriter(r.brokers, 10)
	tp := thirdparty.NewClient(r.url, &http.Client{Timeout: callTimeout})
	cfg.Name, cfg.Logger = "shim", r.quiet
	r.metrics = prometheus.NewRegistry()
	src := inbox.GroupConfig{Brokers: r.brokers, Topic: r.topic, Group: group}
	c, err := lease.NewConsumer(r.pool, src, w, shim.New(tp, r.quiet).WithMetrics(shim.NewMetrics(r.metrics)).Effect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the test runs the consumer, so it runs after the
	// consumer stopped: cleanups run last first.
	t.Cleanup(func() { w.Close() })
	return c
}

// diesAfterTheFirstCall publishes one payment and runs a first life of the
// shim in a new group: it calls the third party once, then dies at the
// crash point before marking it done. It returns the payment and the group.
func (r *rig) diesAfterTheFirstCall(t *testing.T) (ev event.Envelope, group string) {
	t.Helper()
	ev, group = captured(uuid.New()), testinfra.Name("shim")
	r.publish(t, ev)
	first := r.consumer(t, group, 5*time.Second, lease.Config{LeaseTTL: 500 * time.Millisecond})
	killed := errors.New("killed")
	ctx := inboxtest.WithCrashPoint(context.Background(), func(name string) error {
		if name == inboxtest.CrashAfterEffect {
			return killed
		}
		return nil
	})
	if err := first.Run(ctx); !errors.Is(err, killed) {
		t.Fatalf("first life ended with %v, want the crash", err)
	}
	return ev, group
}

// capturedPayments is n payments of distinct orders.
func capturedPayments(n int) []event.Envelope {
	evs := make([]event.Envelope, n)
	for i := range evs {
		evs[i] = captured(uuid.New())
	}
	return evs
}

func captured(orderID uuid.UUID) event.Envelope {
	body, _ := json.Marshal(map[string]any{
		"paymentId": uuid.New(), "orderId": orderID, "customerId": "c", "amountCents": 700, "currency": "EUR", "at": time.Now(),
		"orderEventAt": time.Now().Add(-time.Second),
	})
	return event.Envelope{
		EventID: uuid.New(), EventType: shim.EventPaymentCaptured, EventVersion: 1,
		AggregateType: "payment", AggregateID: orderID.String(), AggregateVersion: 1,
		OccurredAt: time.Now(), Payload: body,
	}
}

func (r *rig) outcome(t *testing.T, ev event.Envelope) (string, string) {
	t.Helper()
	f, err := shim.ReadForward(context.Background(), r.pool, ev.EventID)
	if err != nil {
		t.Fatalf("reading the forward of %s: %v", ev.EventID, err)
	}
	return f.Outcome, inboxtest.Status(t, r.pool, "shim", ev.EventID)
}

func TestKilledBetweenTheCallAndDoneTheThirdPartyHoldsOneSettlement(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	// First life: calls the third party, then dies before marking done.
	ev, group := r.diesAfterTheFirstCall(t)
	if st := r.ledger.Stats(); st.Settlements != 1 {
		t.Fatalf("after the first life the third party has %d settlements, want 1", st.Settlements)
	}

	// Second life: the redelivery waits out the dead worker's lease, asks the
	// third party, and records the forward without calling again.
	second := r.consumer(t, group, 5*time.Second, lease.Config{LeaseTTL: 500 * time.Millisecond})
	ctx := context.Background()
	testinfra.RunInBackground(t, "the shim", second.Run)
	testinfra.WaitFor(t, 30*time.Second, "the forward to be recorded", func() (bool, error) {
		n, err := shim.CountForwards(ctx, r.pool)
		return n == 1, err
	})
	if outcome, status := r.outcome(t, ev); outcome != string(lease.AlreadyPresent) || status != "processed" {
		t.Fatalf("outcome %q, inbox status %q; want already_present and processed", outcome, status)
	}
	if st := r.ledger.Stats(); st.Settlements != 1 || st.Duplicates != 0 {
		t.Fatalf("third party: %+v, want exactly one settlement", st)
	}
}

func TestAFailingOrHangingThirdPartyIsRetriedWithoutDuplicates(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	first, second := captured(uuid.New()), captured(uuid.New())
	client := thirdparty.NewClient(r.url, nil).WithAdmin(r.adminURL, "test-token")
	// The payments meet two 500s and a call that is booked but answered only
	// after the shim's client gave up.
	if err := client.SetFaults(context.Background(), thirdparty.Faults{FailNext: 2, HangNext: 1, HangFor: "2s"}); err != nil {
		t.Fatal(err)
	}
	r.publish(t, first, second)
	reg := prometheus.NewRegistry()
	c := r.consumer(t, testinfra.Name("shim"), 300*time.Millisecond, lease.Config{LeaseTTL: 2 * time.Second, Config: inbox.Config{
		Workers: 1, BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Metrics: inbox.NewMetrics(reg),
	}})
	ctx := context.Background()
	testinfra.RunInBackground(t, "the shim", c.Run)
	testinfra.WaitFor(t, 30*time.Second, "both forwards recorded", func() (bool, error) {
		n, err := shim.CountForwards(ctx, r.pool)
		return n == 2, err
	})
	if st := r.ledger.Stats(); st.Settlements != 2 || st.Duplicates != 0 {
		t.Fatalf("third party: %+v, want 2 settlements and no duplicates", st)
	}
	// The two payments are called concurrently, so either may meet the
	// faults; the one whose call hung (booked, answered too late) is found
	// by the check and recorded as already present, the other as sent.
	outcomes := map[string]int{}
	for _, ev := range []event.Envelope{first, second} {
		outcome, _ := r.outcome(t, ev)
		outcomes[outcome]++
	}
	if outcomes[string(lease.AlreadyPresent)] != 1 || outcomes[string(lease.Sent)] != 1 {
		t.Fatalf("outcomes %v, want one already_present (the call that timed out but landed) and one sent", outcomes)
	}
	// A 500 and a timeout are the third party's outage, not the payment's
	// failure: waited out, never an attempt.
	if got := testinfra.MetricValue(t, reg, "inbox_failures_total"); got != 0 {
		t.Fatalf("inbox_failures_total = %v, want 0 (the 500s and the timeout are outages)", got)
	}
	if got := testinfra.LabeledMetricValue(t, reg, "inbox_effect_errors_total", map[string]string{"op": "call"}); got != 3 {
		t.Fatalf("inbox_effect_errors_total{op=call} = %v, want 3 (two 500s and one timeout)", got)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"shim_thirdparty_errors_total", map[string]string{"op": shim.OpSettle, "kind": shim.ErrorStatus}, 2},
		{"shim_thirdparty_errors_total", map[string]string{"op": shim.OpSettle, "kind": shim.ErrorTimeout}, 1},
		{"shim_thirdparty_errors_total", map[string]string{"op": shim.OpLookup}, 0},
		{"shim_forwards_total", map[string]string{"kind": thirdparty.KindCapture, "outcome": string(lease.Sent)}, 1},
		{"shim_forwards_total", map[string]string{"kind": thirdparty.KindCapture, "outcome": string(lease.AlreadyPresent)}, 1},
		{"shim_settlement_lag_seconds", map[string]string{"kind": thirdparty.KindCapture}, 2},
	} {
		if got := testinfra.LabeledMetricValue(t, r.metrics, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

func TestManyPaymentsThroughFailuresHangsAndACrashAreEachBookedOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const payments = 12
	evs := capturedPayments(payments)
	client := thirdparty.NewClient(r.url, nil).WithAdmin(r.adminURL, "test-token")
	// Calls in flight meet 500s and calls that are booked but answered after
	// the shim's client gave up; then the shim dies between calls and done.
	if err := client.SetFaults(context.Background(), thirdparty.Faults{FailNext: 3, HangNext: 2, HangFor: "1s"}); err != nil {
		t.Fatal(err)
	}
	r.publish(t, evs...)
	group := testinfra.Name("shim")
	backoff := lease.Config{Config: inbox.Config{BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond}, LeaseTTL: time.Second, MaxInFlight: 4}

	killed := errors.New("killed")
	var passes atomic.Int32
	first := r.consumer(t, group, 300*time.Millisecond, backoff)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	crashAtTheFourth := inboxtest.WithCrashPoint(ctx, func(name string) error {
		if name == inboxtest.CrashAfterEffect && passes.Add(1) == 4 {
			return killed
		}
		return nil
	})
	if err := first.Run(crashAtTheFourth); !errors.Is(err, killed) {
		t.Fatalf("first life ended with %v, want the crash", err)
	}

	second := r.consumer(t, group, 300*time.Millisecond, backoff)
	testinfra.RunInBackground(t, "the shim", second.Run)
	testinfra.WaitFor(t, 60*time.Second, "every forward recorded", func() (bool, error) {
		n, err := shim.CountForwards(ctx, r.pool)
		return n == payments, err
	})
	if st := r.ledger.Stats(); st.Settlements != payments || st.Duplicates != 0 {
		t.Fatalf("third party: %+v, want %d settlements and no duplicates", st, payments)
	}
	present := 0
	for _, ev := range evs {
		if outcome, _ := r.outcome(t, ev); outcome == string(lease.AlreadyPresent) {
			present++
		}
	}
	if present < 2 {
		t.Fatalf("%d forwards already present, want at least the 2 hung calls (and those the crash left leased)", present)
	}
	t.Logf("%d payments, %d found already booked by a check", payments, present)
}
