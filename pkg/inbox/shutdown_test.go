package inbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
	"github.com/onceflow/onceflow/pkg/platform/testinfra"
)

// A consumer whose transactions never commit (a deferred foreign key that
// is always violated) and whose dead-letter topic cannot be reached is
// stuck in the worst place: retrying a message, or publishing its dead
// letter, forever. SIGTERM (ctx) must still end Run within ShutdownGrace.
func TestRunEndsWithinTheGraceWhenCommitAndDeadLetterAlwaysFail(t *testing.T) {
	for _, tt := range []struct {
		name        string
		maxAttempts int
		waitFor     string // the loop the consumer is in when ctx ends
	}{
		{"stuck retrying the commit", 1_000_000, "inbox_failures_total"},
		{"stuck publishing the dead letter", 2, "inbox_kafka_errors_total"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			if _, err := f.pool.Exec(context.Background(), `
				CREATE TABLE parents (id text PRIMARY KEY);
				CREATE TABLE children (id text REFERENCES parents DEFERRABLE INITIALLY DEFERRED)`); err != nil {
				t.Fatal(err)
			}
			f.produce(t, event.ToKafka(f.topic, newEvent("orphan", 1)))
			unreachable := kafkautil.NewWriter([]string{"127.0.0.1:1"}, 10)
			defer unreachable.Close()
			const grace = 500 * time.Millisecond
			metrics := inbox.NewMetrics(f.registry)
			c, err := inbox.NewConsumer(f.pool, f.source(testinfra.Name("group")), unreachable,
				func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
					_, err := tx.Exec(ctx, `INSERT INTO children VALUES ($1)`, ev.AggregateID)
					return err // fine now; the commit fails
				}, inbox.Config{Name: "stuck", MaxAttempts: tt.maxAttempts, BackoffMin: time.Millisecond,
					BackoffMax: 20 * time.Millisecond, ShutdownGrace: grace, Metrics: metrics})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			testinfra.WaitFor(t, 30*time.Second, "the consumer to be stuck ("+tt.waitFor+")", func() (bool, error) {
				return testinfra.MetricValue(t, f.registry, tt.waitFor) >= 3, nil
			})
			if tt.waitFor == "inbox_kafka_errors_total" {
				if err := c.Healthy(); err == nil || !strings.Contains(err.Error(), "kafka") {
					t.Errorf("Healthy() = %v while the dead-letter topic is unreachable, want a kafka error", err)
				}
			}

			cancelled := time.Now()
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v, want nil after ctx ended", err)
				}
				// The grace, plus leaving the group and the last commit.
				if took := time.Since(cancelled); took > grace+3*time.Second {
					t.Errorf("Run took %v to return after ctx ended, want about the grace (%v)", took, grace)
				}
			case <-time.After(grace + 10*time.Second):
				t.Fatalf("Run did not return within %v of ctx ending", grace+10*time.Second)
			}
			if n := f.count(t, "SELECT count(*) FROM children"); n != 0 {
				t.Fatalf("%d children committed; the commit was to fail every time", n)
			}
		})
	}
}
