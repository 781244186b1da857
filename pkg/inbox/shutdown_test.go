package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
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
			if _, err := f.Pool.Exec(context.Background(), `
				CREATE TABLE parents (id text PRIMARY KEY);
				CREATE TABLE children (id text REFERENCES parents DEFERRABLE INITIALLY DEFERRED)`); err != nil {
				t.Fatal(err)
			}
			f.Produce(t, event.ToKafka(f.Topic, inboxtesting.NewEvent("orphan", 1)))
			unreachable := testenv.NewWriter([]string{"127.0.0.1:1"}, 10)
			defer unreachable.Close()
			const grace = 500 * time.Millisecond
			metrics := inbox.NewMetrics(f.Registry)
			c, err := inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), unreachable,
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
			testenv.WaitFor(t, 30*time.Second, "the consumer to be stuck ("+tt.waitFor+")", func() (bool, error) {
				return testenv.MetricValue(t, f.Registry, tt.waitFor) >= 3, nil
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
			if n := f.Count(t, "SELECT count(*) FROM children"); n != 0 {
				t.Fatalf("%d children committed; the commit was to fail every time", n)
			}
		})
	}
}

// A database connection that dies under the handler (the server terminates
// the backend, as a restart or failover does), or a statement the server
// refuses because it is shutting down (SQLSTATE 57P01, raised here on a
// live connection so the savepoint survives it), is an outage, not the
// message's fault: it is waited out however often it happens, never spends
// the message's MaxAttempts, and never dead-letters it.
func TestADatabaseOutageDoesNotSpendTheRetryBudget(t *testing.T) {
	inBothModes(t, func(t *testing.T, f *fixture, mode string) {
		ev := inboxtesting.NewEvent("survivor", 1)
		f.Produce(t, event.ToKafka(f.Topic, ev))
		var kills atomic.Int32
		const outages = 6 // more than MaxAttempts
		// killOwnConnection ends the session it runs in from the server
		// side, or has the server refuse a statement as during a shutdown.
		killOwnConnection := func(ctx context.Context, exec func(context.Context, string, ...any) (pgconn.CommandTag, error)) error {
			n := kills.Add(1)
			if n > outages {
				return nil
			}
			kill := `SELECT pg_terminate_backend(pg_backend_pid())`
			if n%2 == 0 {
				kill = `DO $$ BEGIN RAISE EXCEPTION 'terminating connection due to administrator command' USING ERRCODE = '57P01'; END $$`
			}
			_, err := exec(ctx, kill)
			if err == nil {
				err = errors.New("the backend survived pg_terminate_backend")
			}
			return err
		}
		cfg := inbox.Config{Name: "outage-" + mode, MaxAttempts: 2, BackoffMin: time.Millisecond,
			BackoffMax: 20 * time.Millisecond, Metrics: inbox.NewMetrics(f.Registry)}
		var c *inbox.Consumer
		var err error
		if mode == "transactional" {
			c, err = inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer,
				func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
					if err := killOwnConnection(ctx, tx.Exec); err != nil {
						return err
					}
					return f.recordEffect(ctx, tx, ev)
				}, cfg)
		} else {
			// In lease mode the outage hits the lease transaction; the
			// side effect is the call that follows.
			c, err = lease.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, lease.Effect{
				Check: func(context.Context, string) (bool, error) { return false, nil },
				Call: func(ctx context.Context, ev event.Envelope, _ string) error {
					_, err := f.Pool.Exec(ctx, "INSERT INTO effects (event_id, aggregate_id) VALUES ($1, $2)", ev.EventID, ev.AggregateID)
					return err
				},
				Done: func(ctx context.Context, tx pgx.Tx, _ event.Envelope, _ lease.Outcome) error {
					return killOwnConnection(ctx, tx.Exec)
				},
			}, lease.Config{Config: cfg})
		}
		if err != nil {
			t.Fatal(err)
		}
		inboxtesting.RunUntilCleanup(t, c)
		testenv.WaitFor(t, 30*time.Second, "the event to be handled after the outages", func() (bool, error) {
			return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE message_id = $1 AND status = 'processed'", ev.EventID) == 1, nil
		})
		if got := kills.Load(); got <= outages {
			t.Fatalf("the connection was killed %d times, want %d before the success", got, outages)
		}
		if n := f.Count(t, "SELECT count(*) FROM effects WHERE event_id = $1", ev.EventID); n != 1 {
			t.Fatalf("%d effects, want 1", n)
		}
		if got := testenv.MetricValue(t, f.Registry, "inbox_dead_lettered_total"); got != 0 {
			t.Fatalf("inbox_dead_lettered_total = %v: the outage was charged to the message", got)
		}
		if got := testenv.MetricValue(t, f.Registry, "inbox_database_errors_total"); got < 1 {
			t.Fatalf("inbox_database_errors_total = %v, want the outage counted", got)
		}
	})
}

// The database going away for a while (the consumer's connections broken,
// new ones refused) does not end Run in either mode: the consumer reports
// it (Healthy, inbox_database_connected), waits it out, and handles what
// arrived meanwhile once the database is back, dead-lettering nothing.
func TestAPostgresOutageIsWaitedOut(t *testing.T) {
	inBothModes(t, func(t *testing.T, f *fixture, mode string) {
		u, err := url.Parse(f.Pool.Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		proxy := testenv.NewProxy(t, u.Host)
		u.Host = proxy.Addr()
		q := u.Query()
		q.Set("connect_timeout", "1")
		u.RawQuery = q.Encode()
		pool := testenv.NewPool(t, u.String())

		cfg := inbox.Config{Name: "outage-" + mode, MaxAttempts: 2, BackoffMin: 10 * time.Millisecond,
			BackoffMax: 200 * time.Millisecond, LagInterval: 100 * time.Millisecond, Metrics: inbox.NewMetrics(f.Registry)}
		c := f.modeConsumer(t, mode, pool, testenv.Name("group"), insertEffect, cfg)
		running := inboxtesting.RunUntilCleanup(t, c)

		f.Produce(t, event.ToKafka(f.Topic, inboxtesting.NewEvent("before", 1)))
		testenv.WaitFor(t, 30*time.Second, "the first event", func() (bool, error) {
			return f.Count(t, "SELECT count(*) FROM effects") == 1, running()
		})
		proxy.Cut()
		var during []event.Envelope
		for i := range 5 {
			ev := inboxtesting.NewEvent(fmt.Sprintf("during-%d", i), 1)
			during = append(during, ev)
			f.Produce(t, event.ToKafka(f.Topic, ev))
		}
		testenv.WaitFor(t, 30*time.Second, "the outage to show in Healthy and the gauge", func() (bool, error) {
			err := c.Healthy()
			return err != nil && strings.Contains(err.Error(), "database") &&
				testenv.MetricValue(t, f.Registry, "inbox_database_connected") == 0, running()
		})
		// Long enough for several retries of every message.
		deadline := time.Now().Add(2 * time.Second)
		testenv.WaitFor(t, 10*time.Second, "the outage to last two seconds", func() (bool, error) {
			return time.Now().After(deadline), running()
		})
		proxy.Heal()
		testenv.WaitFor(t, 30*time.Second, "the events of the outage to be handled", func() (bool, error) {
			return f.Count(t, "SELECT count(*) FROM effects") == 1+len(during), running()
		})
		testenv.WaitFor(t, 10*time.Second, "Healthy to clear", func() (bool, error) {
			return c.Healthy() == nil && testenv.MetricValue(t, f.Registry, "inbox_database_connected") == 1, nil
		})
		if got := testenv.MetricValue(t, f.Registry, "inbox_dead_lettered_total"); got != 0 {
			t.Fatalf("inbox_dead_lettered_total = %v: the outage was charged to the messages", got)
		}
	})
}
