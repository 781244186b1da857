package periodic_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/periodic"
)

func TestRunCallsAtOnceThenEveryIntervalUntilCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var runs atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		periodic.Run(ctx, time.Millisecond, func(context.Context) {
			if runs.Add(1) == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("job ran %d times, want 3 (the last one cancelled)", n)
	}
}
