package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// effectsHandler writes one effects row per event, one by one (Handle) or
// in one statement (HandleBatch); failBatches makes that many HandleBatch
// calls fail first.
type effectsHandler struct {
	failBatches int
	batches     [][]inbox.Applying
	handled     []uuid.UUID
}

func (h *effectsHandler) Handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	h.handled = append(h.handled, ev.EventID)
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, aggregate_id) VALUES ($1, $2)`, ev.EventID, ev.AggregateID)
	return err
}

func (h *effectsHandler) HandleBatch(ctx context.Context, tx pgx.Tx, evs []inbox.Applying) error {
	h.batches = append(h.batches, evs)
	if h.failBatches > 0 {
		h.failBatches--
		return errors.New("the batch fails")
	}
	ids, aggs := make([][16]byte, len(evs)), make([]string, len(evs))
	for i, a := range evs {
		ids[i], aggs[i] = a.Event.EventID, a.Event.AggregateID
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, aggregate_id) SELECT * FROM unnest($1::uuid[], $2::text[])`, ids, aggs)
	return err
}

// A BatchHandler gets a batch's new events at once, each in its own
// consumer span, duplicates left out; when the batch fails, each event is
// handled on its own with Handle, once.
func TestABatchHandlerAppliesTheNewEventsOfABatchAtOnce(t *testing.T) {
	f := newFixture(t) // not parallel: it records the process's spans
	spans := testenv.RecordSpans(t)
	evs := []event.Envelope{inboxtesting.NewEvent("a", 1), inboxtesting.NewEvent("b", 1), inboxtesting.NewEvent("a", 2)}
	cfg := inbox.Config{Name: "batched"}

	h := &effectsHandler{}
	inboxtest.DeliverBatched(t, f.Pool, cfg, h, evs[0], evs[1], evs[0], evs[2])
	if len(h.batches) != 1 || len(h.batches[0]) != 3 || len(h.handled) != 0 {
		t.Fatalf("HandleBatch got %d batches (first of %d), Handle %d events; want one batch of the 3 new events",
			len(h.batches), len(h.batches[0]), len(h.handled))
	}
	seen := map[trace.SpanID]bool{}
	for i, a := range h.batches[0] {
		sc := trace.SpanContextFromContext(a.Ctx)
		if a.Event.EventID != evs[i].EventID || !sc.IsValid() || seen[sc.SpanID()] {
			t.Fatalf("event %d: %s in span %v; want %s in a consumer span of its own", i, a.Event.EventID, sc.SpanID(), evs[i].EventID)
		}
		seen[sc.SpanID()] = true
	}
	if n := len(spans.Ended()); n < 3 {
		t.Fatalf("%d spans ended, want the 3 events' consumer spans", n)
	}

	more := []event.Envelope{inboxtesting.NewEvent("c", 1), inboxtesting.NewEvent("d", 1)}
	h = &effectsHandler{failBatches: 1}
	if dl := inboxtest.DeliverBatched(t, f.Pool, cfg, h, more...); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
	if len(h.batches) != 1 || len(h.handled) != 2 {
		t.Fatalf("after a failed batch: %d batches, %d events handled one by one; want 1 and 2", len(h.batches), len(h.handled))
	}
	if n := f.Count(t, "SELECT count(*) FROM effects"); n != len(evs)+len(more) {
		t.Fatalf("%d effects, want one per event (%d)", n, len(evs)+len(more))
	}
}
