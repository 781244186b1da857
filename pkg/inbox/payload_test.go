package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox/lease/leasetest"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A redelivered event id with another payload is a producer bug: still a
// no-op, but counted, in a batch and alone, in plain and lease mode.
func TestADuplicateWithAnotherPayloadIsCounted(t *testing.T) {
	t.Parallel()
	pool := inboxtest.NewDatabase(t)
	reg := prometheus.NewRegistry()
	metrics := inbox.NewMetrics(reg)
	mismatches := func() float64 { return testenv.MetricValue(t, reg, "inbox_payload_mismatches_total") }
	var handled int
	h := func(context.Context, pgx.Tx, event.Envelope) error { handled++; return nil }
	first := event.Envelope{
		EventID: uuid.New(), EventType: "ThingHappened", EventVersion: 1, AggregateType: "thing",
		AggregateID: "a", AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{"n":1}`),
	}
	changed := first
	changed.Payload = []byte(`{"n":2}`)
	cfg := inbox.Config{Name: "c", Metrics: metrics}

	inboxtest.Deliver(t, pool, cfg, h, first, first) // a batch: same payload
	if got := mismatches(); got != 0 {
		t.Fatalf("%v mismatches for an identical redelivery, want 0", got)
	}
	inboxtest.Deliver(t, pool, cfg, h, changed) // alone
	inboxtest.Deliver(t, pool, cfg, h, first, changed)
	if got := mismatches(); got != 2 {
		t.Fatalf("%v mismatches, want 2", got)
	}
	if handled != 1 {
		t.Fatalf("handler ran %d times, want 1", handled)
	}
	inboxtest.RequireProcessed(t, pool, "c", first.EventID)

	leased := lease.Config{Config: inbox.Config{Name: "l", Metrics: metrics}}
	eff := lease.Effect{
		Check: func(context.Context, string) (bool, error) { return false, nil },
		Call:  func(context.Context, event.Envelope, string) error { return nil },
	}
	leasetest.Deliver(t, pool, leased, eff, first)
	leasetest.Deliver(t, pool, leased, eff, changed)
	if got := mismatches(); got != 3 {
		t.Fatalf("%v mismatches after the leased one, want 3", got)
	}
}
