package outboxhttp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/outboxhttp"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// Invariant 8: requeue and replay work in every relay mode or refuse with
// 409, and never answer a success that will not happen. Each mode runs its
// real relay against the real Postgres and Kafka, and the test reads the
// topic: an answer of "requeued": 1 or "count": 1 must be followed by the
// event on the topic again.
//
// The dead row is written before the relay starts, so that no mode has
// published it: the polling relay skips dead rows, and a replication slot
// streams only what commits after its creation.
func TestOperatorActionsInEveryRelayMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.RelayMode{outbox.ModePoll, outbox.ModeCDC, outbox.ModeWAL} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			start := time.Now().Add(-time.Minute)
			brokers := testinfra.KafkaBrokers(t)
			topic := testinfra.NewTopic(t, brokers, 1)
			pool := outboxtest.NewDatabase(t)
			seen := countDeliveries(t, brokers, topic)

			dead := thing("d-1", 1)
			write(t, pool, outbox.Enqueue, dead)
			var deadID int64
			if err := pool.QueryRow(ctx, `UPDATE outbox_events SET state = 'dead', attempts = 10, last_error = 'refused' WHERE event_id = $1 RETURNING id`,
				dead.EventID).Scan(&deadID); err != nil {
				t.Fatal(err)
			}

			startRelay(t, pool, brokers, topic, mode)
			live := thing("a-1", 1)
			write(t, pool, cdc.Write(mode), live)
			seen.waitFor(t, live.EventID, 1, "the relay to publish a fresh event")

			srv := httptest.NewServer(modeHandler(pool, mode))
			defer srv.Close()
			call := func(path, body string, want int) map[string]any {
				t.Helper()
				return testinfra.CallJSON(t, "POST", srv.URL+path, body, want)
			}

			// Requeue: the dead event reaches the topic.
			got := call("/requeue", fmt.Sprintf(`{"ids":[%d]}`, deadID), 200)
			if got["requeued"] != float64(1) {
				t.Fatalf("requeue = %v, want requeued 1", got)
			}
			seen.waitFor(t, dead.EventID, 1, "the requeued event on the topic")
			// Nothing is dead any more; in WAL-only mode, where the relay
			// keeps no dead events, saying "requeued": 0 would hide that.
			if mode == outbox.ModeWAL {
				call("/requeue", `{"all":true}`, 409)
			} else if got := call("/requeue", `{"all":true}`, 200); got["requeued"] != float64(0) {
				t.Fatalf("second requeue = %v, want requeued 0", got)
			}

			// Replay: the live event is published again, same event id.
			window := fmt.Sprintf(`"aggregateType":"thing","aggregateId":"a-1","from":%q,"to":%q`,
				start.Format(time.RFC3339Nano), time.Now().Add(time.Minute).Format(time.RFC3339Nano))
			if mode == outbox.ModeWAL {
				call("/replay", `{`+window+`,"dryRun":false}`, 409)
				return
			}
			// Until the relay has recorded the event as published (a poll
			// relay's published state, a log-based relay's confirmed
			// position), it is not yet in a replay's scope.
			testinfra.WaitFor(t, 20*time.Second, "the event to be in the replay's scope", func() (bool, error) {
				return call("/replay", `{`+window+`,"dryRun":true}`, 200)["count"] == float64(1), nil
			})
			if got := call("/replay", `{`+window+`,"dryRun":false}`, 200); got["count"] != float64(1) {
				t.Fatalf("replay = %v, want count 1", got)
			}
			seen.waitFor(t, live.EventID, 2, "the replayed event on the topic")
		})
	}
}

// modeHandler is the operator handler of a service running mode.
func modeHandler(pool *pgxpool.Pool, mode outbox.RelayMode) http.Handler {
	return outboxhttp.Handler(pool, mode, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// startRelay runs mode's relay on pool until the test ends.
func startRelay(t *testing.T, pool *pgxpool.Pool, brokers []string, topic string, mode outbox.RelayMode) {
	t.Helper()
	w := kafkautil.NewWriter(brokers, 100)
	t.Cleanup(func() { w.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := cdc.PublisherConfig{
		Mode: mode, Topic: func(string) string { return topic }, Logger: quiet,
		Poll: outbox.RelayConfig{PollInterval: 100 * time.Millisecond},
		CDC:  cdc.Config{StatusInterval: 100 * time.Millisecond, RetentionInterval: 100 * time.Millisecond},
	}
	if mode != outbox.ModePoll {
		cfg.CDC.Slot = testinfra.Name("slot")
		// Registered before the relay's stop, so it runs after it: a
		// database with a slot cannot be dropped.
		t.Cleanup(func() {
			testinfra.WaitFor(t, 20*time.Second, "the slot to be dropped", func() (bool, error) {
				_, err := pool.Exec(context.Background(),
					`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, cfg.CDC.Slot)
				return err == nil, nil // 55006 while the walsender is still going away
			})
		})
	}
	relay, err := cdc.NewPublisher(pool, w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	if logBased, ok := relay.(*cdc.Relay); ok {
		testinfra.WaitFor(t, 20*time.Second, "the relay to stream", func() (bool, error) { return logBased.Active(), nil })
	}
}

func thing(id string, version int64) event.Envelope {
	return event.Envelope{
		EventID: uuid.New(), EventType: "ThingHappened", EventVersion: 1, AggregateType: "thing",
		AggregateID: id, AggregateVersion: version, OccurredAt: time.Now(), Payload: []byte(`{"n":1}`),
	}
}

func write(t *testing.T, pool *pgxpool.Pool, w cdc.WriteFunc, ev event.Envelope) {
	t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w(ctx, tx, ev) }); err != nil {
		t.Fatal(err)
	}
}

// deliveries counts the messages of a topic per event id.
type deliveries struct {
	mu sync.Mutex
	n  map[uuid.UUID]int
}

func countDeliveries(t *testing.T, brokers []string, topic string) *deliveries {
	t.Helper()
	d := &deliveries{n: map[uuid.UUID]int{}}
	testinfra.ReadEvents(t, brokers, topic, func(ev event.Envelope) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.n[ev.EventID]++
	})
	return d
}

// waitFor waits until id was delivered at least n times.
func (d *deliveries) waitFor(t *testing.T, id uuid.UUID, n int, what string) {
	t.Helper()
	testinfra.WaitFor(t, 30*time.Second, what, func() (bool, error) {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.n[id] >= n, nil
	})
}

// A handler wired with no mode or an unknown one refuses to be built: it
// could not know whether a requeue will happen.
func TestHandlerNeedsAKnownRelayMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.RelayMode{"", "POLL", "kafka-connect"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Handler with mode %q did not panic", mode)
				}
			}()
			outboxhttp.Handler(nil, mode, slog.New(slog.NewTextHandler(io.Discard, nil)))
		}()
	}
}
