package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A row refused because of the message holds back the later rows of its
// aggregate within its own batch, not only in the batches after it: the
// broker must never have v2 while it does not have v1, however the refusal
// comes about. Each case puts big/1 (refused), big/2 and fine/1 in one
// batch; after that batch the topic must hold fine/1 alone. Then the refused
// event is made publishable and the held-back one must follow it, in order.
func TestAFailedRowHoldsBackItsAggregateInsideItsBatch(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		// topicMax is the topic's max.message.bytes; the writer keeps
		// kafka-go's BatchBytes of 1 MiB.
		topicMax        int
		big1, big2      int // payload sizes
		refusedBy       string
		makePublishable func(t *testing.T, brokers []string, topic string) *testenv.Writer
	}{{
		// kafka-go refuses the whole write before sending anything, naming
		// the message; the relay writes the rest again without it.
		name: "refused by the writer", topicMax: 4 << 20, big1: 1200 << 10, big2: 10,
		refusedBy: "Message Size Too Large",
		makePublishable: func(t *testing.T, brokers []string, topic string) *testenv.Writer {
			return newWideWriter(brokers)
		},
	}, {
		// The broker refuses the partition's whole record batch; the relay
		// then writes each refused message on its own to find the culprit.
		name: "refused by the broker", topicMax: 100 << 10, big1: 200 << 10, big2: 10,
		refusedBy: "Message Size Too Large",
		makePublishable: func(t *testing.T, brokers []string, topic string) *testenv.Writer {
			raiseTopicMax(t, brokers, topic)
			return testenv.NewWriter(brokers, 10)
		},
	}, {
		// big/1 and big/2 do not fit one of kafka-go's batches (BatchBytes),
		// so the writer sends them to the partition in two record batches,
		// one after the other, in one WriteMessages call: the broker refuses
		// the first and takes the second.
		name: "refused by the broker, across the writer's batches", topicMax: 600 << 10, big1: 700 << 10, big2: 400 << 10,
		refusedBy: "Message Size Too Large",
		makePublishable: func(t *testing.T, brokers []string, topic string) *testenv.Writer {
			raiseTopicMax(t, brokers, topic)
			return testenv.NewWriter(brokers, 10)
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			brokers := testenv.KafkaBrokers(t)
			topic := newTopicWithMax(t, brokers, tt.topicMax)
			pool := newOutboxDB(t)
			big1, big2 := newEvent("big", 1), newEvent("big", 2)
			big1.Payload, big2.Payload = blob("x", tt.big1), blob("y", tt.big2)
			enqueue(t, pool, big1, big2, newEvent("fine", 1))

			w := testenv.NewWriter(brokers, 10)
			defer w.Close()
			cfg := outbox.RelayConfig{
				Topic:       func(string) string { return topic },
				MaxAttempts: 2, BackoffMin: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
			}
			relay, err := outbox.NewRelay(pool, w, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := relay.RelayBatch(ctx); err != nil || n != 3 {
				t.Fatalf("first batch: n=%d err=%v, want all three claimed", n, err)
			}
			// The writes were acknowledged before RelayBatch returned, so
			// the partition's end is final here: no wait needed.
			if got := onTopic(t, brokers, topic); !slices.Equal(got, []string{"fine/1"}) {
				t.Fatalf("after the batch the topic holds %v, want [fine/1]: big/2 went to Kafka while big/1, refused, did not", got)
			}
			var lastErr string
			if err := pool.QueryRow(ctx, `SELECT coalesce(last_error, '') FROM outbox_events WHERE event_id = $1`,
				big1.EventID).Scan(&lastErr); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(lastErr, tt.refusedBy) {
				t.Fatalf("big/1's last_error = %q, want %q: the test did not produce the refusal it is about", lastErr, tt.refusedBy)
			}
			if n := countRows(t, pool, fmt.Sprintf("state = 'pending' AND attempts = 0 AND event_id = '%s'", big2.EventID)); n != 1 {
				t.Fatal("big/2 is not pending and uncharged behind big/1")
			}

			// big/1 goes dead, and big/2 keeps waiting behind it, untried.
			relayUntil(t, relay, 30*time.Second, "big/1 to go dead", func() (bool, error) {
				return countRows(t, pool, "state = 'dead'") == 1, nil
			})
			if got := onTopic(t, brokers, topic); !slices.Equal(got, []string{"fine/1"}) {
				t.Fatalf("while big/1 is dead the topic holds %v, want [fine/1]", got)
			}
			if n := countRows(t, pool, fmt.Sprintf("state = 'pending' AND attempts = 0 AND event_id = '%s'", big2.EventID)); n != 1 {
				t.Fatal("big/2 did not wait behind the dead big/1")
			}

			// The operator makes big/1 publishable and requeues it: both go,
			// in order.
			relay.Close()
			w2 := tt.makePublishable(t, brokers, topic)
			defer w2.Close()
			relay, err = outbox.NewRelay(pool, w2, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer relay.Close()
			requeueDeadRows(t, pool, 1)
			relayUntil(t, relay, 30*time.Second, "big/1 and big/2 to publish", func() (bool, error) {
				return countRows(t, pool, "state = 'published'") == 3, nil
			})
			if got := onTopic(t, brokers, topic); !slices.Equal(got, []string{"fine/1", "big/1", "big/2"}) {
				t.Fatalf("the topic holds %v, want [fine/1 big/1 big/2]", got)
			}
		})
	}
}

// A row that fails and is then published (here: the topic's limit is raised
// while it backs off) releases the rows held behind it, in order.
func TestAFailedRowReleasesItsAggregateOnceItIsPublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testenv.KafkaBrokers(t)
	topic := newSmallTopic(t, brokers)
	pool := newOutboxDB(t)
	big1 := newEvent("big", 1)
	big1.Payload = blob("x", bigBlob)
	enqueue(t, pool, big1, newEvent("big", 2), newEvent("big", 3), newEvent("fine", 1))

	w := testenv.NewWriter(brokers, 10)
	defer w.Close()
	relay, err := outbox.NewRelay(pool, w, outbox.RelayConfig{
		Topic:       func(string) string { return topic },
		MaxAttempts: 1000, BackoffMin: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	if _, err := relay.RelayBatch(ctx); err != nil {
		t.Fatal(err)
	}
	if got := onTopic(t, brokers, topic); !slices.Equal(got, []string{"fine/1"}) {
		t.Fatalf("after the batch the topic holds %v, want [fine/1]", got)
	}
	raiseTopicMax(t, brokers, topic)
	relayUntil(t, relay, 30*time.Second, "big/1..3 to publish", func() (bool, error) {
		return countRows(t, pool, "state = 'published'") == 4, nil
	})
	if got := onTopic(t, brokers, topic); !slices.Equal(got, []string{"fine/1", "big/1", "big/2", "big/3"}) {
		t.Fatalf("the topic holds %v, want [fine/1 big/1 big/2 big/3]", got)
	}
}

// relayUntil runs relay's batches one after the other until done says so,
// failing the test if a batch fails or done has not come within timeout;
// what names the wait.
func relayUntil(t *testing.T, relay *outbox.Relay, timeout time.Duration, what string, done func() (bool, error)) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, func() (bool, error) {
		if _, err := relay.RelayBatch(context.Background()); err != nil {
			return false, err
		}
		return done()
	})
}

// requeueDeadRows requeues every dead row, as an operator would, and fails
// unless there were want.
func requeueDeadRows(t *testing.T, pool *pgxpool.Pool, want int) {
	t.Helper()
	if n, err := outboxadmin.Requeue(context.Background(), pool, outbox.ModePoll, deadIDs(t, pool)...); err != nil || n != want {
		t.Fatalf("requeue: n=%d err=%v, want %d", n, err, want)
	}
}
