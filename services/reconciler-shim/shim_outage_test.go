package shim_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/platform/testinfra"
	shim "github.com/onceflow/onceflow/services/reconciler-shim"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// deadLettered counts the shim's dead-lettered inbox rows.
func (r *rig) deadLettered(t *testing.T) int {
	t.Helper()
	var n int
	if err := r.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM inbox_messages WHERE status = 'dead_lettered'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// thirdPartyErrors sums shim_thirdparty_errors_total over its labels.
func (r *rig) thirdPartyErrors(t *testing.T) float64 {
	t.Helper()
	return testinfra.MetricValue(t, r.metrics, "shim_thirdparty_errors_total")
}

// An outage of the third party is nobody's message's fault: the shim waits
// it out, however long it lasts, and forwards every payment once when the
// third party is back, dead-lettering none.
func TestAThirdPartyDownLongerThanTheRetryBudgetDeadLettersNothingAndDeliversAllWhenBack(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const payments = 6
	evs := capturedPayments(payments)
	r.mode.Store(apiDown)
	r.publish(t, evs...)
	reg := prometheus.NewRegistry()
	// A retry budget of well under a second: 3 attempts, 10-50ms apart.
	c := r.consumer(t, testinfra.Name("shim"), 300*time.Millisecond, lease.Config{LeaseTTL: 2 * time.Second, Config: inbox.Config{
		MaxAttempts: 3, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Metrics: inbox.NewMetrics(reg),
	}})
	ctx := context.Background()
	testinfra.RunInBackground(t, "the shim", c.Run)

	// Far more failed calls than the budget allows every payment, or the
	// first dead letter.
	const budget = 3 * payments
	testinfra.WaitFor(t, 30*time.Second, "the outage to outlast every payment's retry budget", func() (bool, error) {
		return r.thirdPartyErrors(t) > 3*budget || r.deadLettered(t) > 0, nil
	})
	if n := r.deadLettered(t); n > 0 {
		t.Fatalf("%d of %d payments dead-lettered because the third party was down", n, payments)
	}
	if got := testinfra.MetricValue(t, reg, "inbox_failures_total"); got > payments {
		t.Errorf("inbox_failures_total = %v after %v failed calls: the outage was charged to the payments", got, r.thirdPartyErrors(t))
	}
	if err := c.Healthy(); err == nil || !strings.Contains(err.Error(), "third party") {
		t.Errorf("Healthy() = %v during the outage, want the third party named", err)
	}
	if got := testinfra.MetricValue(t, reg, "inbox_effect_connected"); got != 0 {
		t.Errorf("inbox_effect_connected = %v during the outage, want 0", got)
	}

	r.mode.Store(apiUp)
	testinfra.WaitFor(t, 30*time.Second, "every payment forwarded once the third party is back", func() (bool, error) {
		n, err := shim.CountForwards(ctx, r.pool)
		return n == payments, err
	})
	if st := r.ledger.Stats(); st.Settlements != payments || st.Duplicates != 0 {
		t.Fatalf("third party: %+v, want %d settlements and no duplicates", st, payments)
	}
	if n := r.deadLettered(t); n > 0 {
		t.Fatalf("%d payments dead-lettered", n)
	}
	testinfra.WaitFor(t, 10*time.Second, "readiness to recover", func() (bool, error) {
		return c.Healthy() == nil, nil
	})
}

// A takeover that must ask the third party whether an earlier delivery
// booked the payment, and gets no usable answer, records the payment
// uncertain for the reconciliation report, without calling again.
func TestATakeoverThatCannotDecideRecordsThePaymentUncertain(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ev, group := r.diesAfterTheFirstCall(t)

	r.mode.Store(apiLookupLost)
	second := r.consumer(t, group, 5*time.Second, lease.Config{LeaseTTL: 500 * time.Millisecond, Config: inbox.Config{
		MaxAttempts: 2, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}})
	testinfra.RunInBackground(t, "the shim", second.Run)
	var status string
	testinfra.WaitFor(t, 30*time.Second, "the payment to be settled one way or another", func() (bool, error) {
		status = inboxtest.Status(t, r.pool, "shim", ev.EventID)
		return status == "uncertain" || status == "dead_lettered" || status == "processed", nil
	})
	if status != "uncertain" {
		t.Fatalf("the payment is %q, want uncertain", status)
	}
	if st := r.ledger.Stats(); st.Settlements != 1 || st.Duplicates != 0 {
		t.Fatalf("third party: %+v, want the first life's one settlement", st)
	}
}

// What the inbox decides on is the class of the shim's errors: an outage is
// waited out, an undecidable lookup is recorded uncertain, a rejection is
// dead-lettered.
func TestTheShimClassifiesTheThirdPartysFailures(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ev := captured(uuid.New())
	effect := func(url string) lease.Effect {
		return shim.New(thirdparty.NewClient(url, &http.Client{Timeout: 2 * time.Second}), r.quiet).Effect()
	}
	refused := effect("http://" + testinfra.ClosedAddr(t))
	ctx := context.Background()
	key := ev.EventID.String()

	for _, c := range []struct {
		name string
		mode int32
		eff  lease.Effect
		want error
	}{
		{"lookup, connection refused", apiUp, refused, lease.ErrUnavailable},
		{"lookup, 503", apiDown, effect(r.url), lease.ErrUnavailable},
		{"lookup, a bare 404", apiLookupLost, effect(r.url), lease.ErrUnknowable},
		{"lookup, the API's not_found", apiUp, effect(r.url), nil},
	} {
		r.mode.Store(c.mode)
		has, err := c.eff.Check(ctx, key)
		if !errors.Is(err, c.want) || (c.want == nil && err != nil) || has {
			t.Errorf("%s: Check = %v, %v; want false, %v", c.name, has, err, c.want)
		}
	}
	r.mode.Store(apiUp)
	if err := refused.Call(ctx, ev, key); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("settle, connection refused: %v, want ErrUnavailable", err)
	}
	r.mode.Store(apiDown)
	if err := effect(r.url).Call(ctx, ev, key); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("settle, 503: %v, want ErrUnavailable", err)
	}
	r.mode.Store(apiUp)
	bad := ev
	bad.Payload = []byte(`{"paymentId":"` + uuid.NewString() + `","orderId":"` + uuid.NewString() + `","amountCents":700,"currency":"EURO"}`)
	if err := effect(r.url).Call(ctx, bad, key); !errors.Is(err, inbox.ErrPermanent) || errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("settle, rejected: %v, want ErrPermanent", err)
	}
}
