package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// In lease mode the version guard advanced when v1 was leased; v1's effect
// then failed for good and it was dead-lettered. An operator's requeue must
// run the effect, once: today the redelivery is skipped as stale.
func TestLeaseModeARequeuedDeadLetterRunsItsEffectOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	evs := f.leaseEvents(t, 1, 1)
	v1 := evs[0]
	b := newBooker(0)
	var broken atomic.Bool
	broken.Store(true)
	eff := b.effect()
	call := eff.Call
	eff.Call = func(ctx context.Context, ev event.Envelope, key string) error {
		if broken.Load() {
			return inbox.Permanent(errors.New("the third party refuses it for now"))
		}
		return call(ctx, ev, key)
	}
	inboxtesting.RunUntilCleanup(t, f.leaseConsumer(t, testenv.Name("group"), eff, lease.Config{Config: inbox.Config{DeadLetterTopic: dlt}}))

	testenv.WaitFor(t, 30*time.Second, "v1 dead-lettered", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE message_id = $1 AND status = 'dead_lettered'", v1.EventID) == 1, nil
	})
	broken.Store(false) // the cause is fixed
	f.Requeue(t, dlt, 1, v1.EventID)
	testenv.WaitFor(t, 30*time.Second, "the requeued v1 settled", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE message_id = $1 AND status IN ('processed', 'stale')", v1.EventID) == 1, nil
	})
	if n := b.bookings(v1.EventID.String()); n != 1 {
		var status string
		_ = f.Pool.QueryRow(context.Background(), "SELECT status FROM inbox_messages WHERE message_id = $1", v1.EventID).Scan(&status)
		t.Fatalf("the requeued v1 was booked %d times (its inbox row: %s), want once", n, status)
	}
}
