package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A dead letter the dead-letter topic's retention deleted leaves its row
// dead_lettered and its aggregate held: inbox_stranded_holds (which looks
// for a row that is not a dead letter) stays 0, and nothing else said the
// aggregate can no longer be freed by a requeue. A hold older than
// Config.DeadLetterRetention whose letter is only in the topic is counted
// in inbox_holds_past_dead_letter_retention (alert
// InboxDeadLetterPastRetention), until an operator releases or skips it.
func TestAHoldOlderThanTheDeadLetterRetentionIsCounted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	v1, v2 := inboxtesting.NewEvent("order-9", 1), inboxtesting.NewEvent("order-9", 2)
	apply, _ := refusedUntilRepaired(v1)
	cfg := inboxtesting.FastRetries("retention", testenv.NewTopic(t, f.Brokers, 1))
	cfg.LagInterval = 50 * time.Millisecond
	cfg.DeadLetterRetention = time.Hour
	cfg.Metrics = inbox.NewMetrics(f.Registry)
	c, err := inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		return apply(ctx, tx.Exec, ev)
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.Produce(t, event.ToKafka(f.Topic, v1), event.ToKafka(f.Topic, v2))
	running := inboxtesting.RunUntilCleanup(t, c)
	testenv.WaitFor(t, 30*time.Second, "v1 dead and v2 parked", func() (bool, error) {
		return f.Status(t, "retention", v1) == "dead_lettered" &&
			f.Count(t, `SELECT count(*) FROM inbox_parked_messages WHERE message_id = $1`, v2.EventID) == 1, running()
	})
	gauge := func() float64 {
		return testenv.LabeledMetricValue(t, f.Registry, "inbox_holds_past_dead_letter_retention", map[string]string{"consumer": "retention"})
	}
	testenv.WaitFor(t, 10*time.Second, "the hold reported, not yet past the retention", func() (bool, error) {
		return testenv.LabeledMetricValue(t, f.Registry, "inbox_oldest_hold_age_seconds", map[string]string{"consumer": "retention"}) > 0, running()
	})
	if g := gauge(); g != 0 {
		t.Fatalf("a fresh hold counted %v past the retention, want 0", g)
	}

	// Two hours later, by the hold's clock: the topic's retention (an hour)
	// has deleted the letter, and the row still says dead_lettered.
	if _, err := f.Pool.Exec(context.Background(), `UPDATE inbox_dead_keys SET dead_at = now() - interval '2 hours' WHERE message_id = $1`,
		v1.EventID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "inbox_holds_past_dead_letter_retention to count the hold", func() (bool, error) {
		return gauge() == 1, running()
	})
	if s := testenv.LabeledMetricValue(t, f.Registry, "inbox_stranded_holds", map[string]string{"consumer": "retention"}); s != 0 {
		t.Fatalf("inbox_stranded_holds = %v; this test is about the hold it cannot see", s)
	}

	if _, err := inboxadmin.ReleaseHeld(context.Background(), f.Pool, inboxadmin.HeldAction{Consumer: "retention", AggregateType: "thing",
		AggregateID: "order-9", Reason: "its dead letter left the topic; settled by hand"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the released hold no longer counted", func() (bool, error) {
		return gauge() == 0, running()
	})
}
