package lease_test

import (
	"context"
	"testing"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestALeasedSideEffectRunsInAConsumerSpanContinuingTheProducer(t *testing.T) {
	rec, fx, ev, under := inboxtesting.StartTraced(t)
	f := &fixture{fx}
	c, err := lease.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, lease.Effect{
		Check: func(context.Context, string) (bool, error) { return false, nil },
		Call: func(ctx context.Context, ev event.Envelope, _ string) error {
			under.Add(ctx, ev)
			return nil
		},
	}, lease.Config{Config: inbox.Config{Name: "lease-test", Metrics: inbox.NewMetrics(f.Registry)}})
	if err != nil {
		t.Fatal(err)
	}
	inboxtesting.RunUntilCleanup(t, c)

	saw := under.Wait(t, ev, "the side effect to run and be marked done", func() bool {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == 1
	})
	inboxtesting.CheckOneConsumerSpan(t, rec, f.Topic, ev, saw)
}
