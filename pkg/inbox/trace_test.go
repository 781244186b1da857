package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestTheHandlerRunsInAConsumerSpanContinuingTheProducer(t *testing.T) {
	rec, fx, ev, under := inboxtesting.StartTraced(t)
	f := &fixture{fx}
	f.run(t, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		under.Add(ctx, ev)
		return f.recordEffect(ctx, tx, ev)
	}, inbox.Config{})

	saw := under.Wait(t, ev, "the event to be handled", func() bool { return f.Count(t, "SELECT count(*) FROM effects") == 1 })
	inboxtesting.CheckOneConsumerSpan(t, rec, f.Topic, ev, saw)
}

// A handler that fails once takes the batch off the fast path; each run of
// it has its own consumer span in the producer's trace, the failed one
// marked as an error.
func TestEachRunOfAFailingHandlerHasItsOwnSpan(t *testing.T) {
	rec, fx, ev, under := inboxtesting.StartTraced(t)
	f := &fixture{fx}
	var failed atomic.Bool
	f.run(t, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		under.Add(ctx, ev)
		if !failed.Swap(true) {
			return errors.New("transient")
		}
		return f.recordEffect(ctx, tx, ev)
	}, inbox.Config{BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})

	saw := under.Wait(t, ev, "the event to be handled", func() bool { return f.Count(t, "SELECT count(*) FROM effects") == 1 })
	var spans []sdktrace.ReadOnlySpan
	testenv.WaitFor(t, 10*time.Second, "the consumer spans to end", func() (bool, error) {
		spans = inboxtesting.CheckConsumerSpans(t, rec, f.Topic, ev, saw)
		return len(spans) >= 2, nil
	})
	errored := 0
	for _, s := range spans {
		if s.Status().Code == codes.Error {
			errored++
		}
	}
	if errored != len(spans)-1 {
		t.Fatalf("%d of %d runs' spans are errors, want all but the last", errored, len(spans))
	}
}
