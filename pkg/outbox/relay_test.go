package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestACrashBetweenAckAndMarkRepublishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRelayEnv(t, 1, 10)
	pool, c := e.Pool, e.C
	enqueue(t, pool, newEvent("a", 1), newEvent("a", 2))

	crashed := errors.New("killed after the ack")
	relay, err := outbox.NewRelay(pool, e.W, outbox.RelayConfig{Topic: e.TopicFn})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	crashAfterAck := outboxtest.WithCrashPoint(ctx, func(name string) error {
		if name == outboxtest.CrashAfterAck {
			return crashed
		}
		return nil
	})
	if _, err := relay.RelayBatch(crashAfterAck); !errors.Is(err, crashed) {
		t.Fatalf("err = %v, want the crash", err)
	}
	testenv.WaitFor(t, 20*time.Second, "the broker to have the events", func() (bool, error) { return c.Distinct() == 2, nil })
	if n := countRows(t, pool, "state = 'pending'"); n != 2 {
		t.Fatalf("%d rows pending after the crash, want 2: nothing may be marked before the ack is recorded", n)
	}

	// The restarted relay, without the crash point.
	if n, err := relay.RelayBatch(ctx); err != nil || n != 2 {
		t.Fatalf("after restart: n=%d err=%v", n, err)
	}
	testenv.WaitFor(t, 20*time.Second, "the republished duplicates", func() (bool, error) { return c.Dups() == 2, nil })
	if n := countRows(t, pool, "state = 'published'"); n != 2 {
		t.Fatalf("%d rows published, want 2", n)
	}
	c.CheckOrder(t, map[string]int64{"a": 2})
}

// A message the writer refuses as too large is the message's fault: it is
// retried with growing backoff, goes dead after MaxAttempts, holds its
// aggregate's later events back, and charges nothing to its batch-mates.
// Once the operator raises the limit, a requeue publishes it and its
// successor in order.
func TestATooLargeMessageBacksOffThenDeadThenRequeue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testenv.KafkaBrokers(t)
	// The topic takes 2 MiB; kafka-go's writer stops at 1 MiB (BatchBytes).
	topic := newTopicWithMax(t, brokers, 2<<20)
	pool := newOutboxDB(t)
	big1, big2 := newEvent("big", 1), newEvent("big", 2)
	big1.Payload = blob("x", 1200<<10)
	enqueue(t, pool, big1, newEvent("fine", 1))

	w := testenv.NewWriter(brokers, 10)
	defer w.Close()
	reg := prometheus.NewRegistry()
	logs := &testenv.LogBuffer{}
	relay, err := outbox.NewRelay(pool, w, outbox.RelayConfig{
		Topic: func(string) string { return topic }, MaxAttempts: 3, BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second,
		Metrics: outbox.NewMetrics(reg), Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}

	var pendingAttempts int
	relayUntil(t, relay, 60*time.Second, "the too-large event to go dead", func() (bool, error) {
		var state, lastErr string
		var attempts int
		err := pool.QueryRow(ctx, `SELECT state, attempts, coalesce(last_error, '')
			FROM outbox_events WHERE event_id = $1`, big1.EventID).Scan(&state, &attempts, &lastErr)
		if err != nil {
			return false, err
		}
		if attempts > 0 && state == "pending" {
			pendingAttempts = attempts
			if !strings.Contains(lastErr, "Message Size Too Large") {
				return false, fmt.Errorf("last_error = %q, want the writer's refusal", lastErr)
			}
		}
		return state == "dead" && attempts == 3, nil
	})
	// The delays the relay chose, as it logged them: timing them from the
	// outside measures the machine's load as much as the backoff (a claim
	// under parallel tests can take longer than the first delay).
	delays := retryDelays(t, logs.String())
	if pendingAttempts != 2 {
		t.Fatalf("the event was seen pending after %d attempts at most, want 2 before it went dead", pendingAttempts)
	}
	if len(delays) != 2 || delays[1] <= delays[0]/2 {
		t.Fatalf("backoff delays %v: want two, the second not shorter than half the first", delays)
	}
	if n := countRows(t, pool, "state = 'published' AND aggregate_id = 'fine' AND attempts = 1"); n != 1 {
		t.Fatal("the too-large event's batch-mate was not published at its first attempt")
	}
	// The next event of the dead one's aggregate waits behind it, untried.
	enqueue(t, pool, big2)
	for range 3 {
		if _, err := relay.RelayBatch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := countRows(t, pool, fmt.Sprintf("state = 'pending' AND attempts = 0 AND event_id = '%s'", big2.EventID)); n != 1 {
		t.Fatal("the dead event's successor did not wait behind it")
	}
	if got := testenv.MetricValue(t, reg, "outbox_publish_failures_total"); got != 3 {
		t.Fatalf("outbox_publish_failures_total = %v, want 3", got)
	}
	if got := testenv.MetricValue(t, reg, "outbox_kafka_errors_total"); got != 0 {
		t.Fatalf("outbox_kafka_errors_total = %v, want 0: the broker was fine", got)
	}

	// The operator raises the writer's limit (a relay restarted with the new
	// setting) and requeues.
	c := collect(t, brokers, topic)
	relay.Close()
	w2 := newWideWriter(brokers)
	defer w2.Close()
	relay, err = outbox.NewRelay(pool, w2, outbox.RelayConfig{Topic: func(string) string { return topic }})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	requeueDeadRows(t, pool, 1)
	relayUntil(t, relay, 30*time.Second, "the requeued event and its successor to publish", func() (bool, error) {
		return c.Distinct() == 3, nil
	})
	c.CheckOrder(t, map[string]int64{"big": 2, "fine": 1})
}

func deadIDs(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	return testenv.QueryColumn[int64](t, pool, "SELECT id FROM outbox_events WHERE state = 'dead'")
}

// TestRelayProcess is not a test of its own: TestThreeRelaysKeepOrderWhenOneIsKilled
// runs the test binary again with ONCEFLOW_TEST_RELAY_DB set, so that this
// function becomes a relay in a real process that can be killed with SIGKILL.
func TestRelayProcess(t *testing.T) {
	db := os.Getenv("ONCEFLOW_TEST_RELAY_DB")
	if db == "" {
		return
	}
	brokers := strings.Split(os.Getenv("ONCEFLOW_TEST_RELAY_BROKERS"), ",")
	topic := os.Getenv("ONCEFLOW_TEST_RELAY_TOPIC")
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	w := testenv.NewWriter(brokers, 100)
	relay, err := outbox.NewRelay(pool, w, outbox.RelayConfig{
		Topic: func(string) string { return topic }, BatchSize: 100,
		RebalanceInterval: 200 * time.Millisecond, RelayTTL: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signalContext()
	defer stop()
	if err := relay.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		// The parent ends this process with SIGKILL (the point of the test)
		// or, at cleanup, by closing stdin.
		buf := make([]byte, 1)
		_, _ = os.Stdin.Read(buf)
		cancel()
	}()
	return ctx, cancel
}

func TestThreeRelaysKeepOrderWhenOneIsKilled(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 6)
	dbURL := newOutboxDBURL(t)
	pool := testenv.NewPool(t, dbURL)
	c := collect(t, brokers, topic)

	relays := make([]*exec.Cmd, 3)
	for i := range relays {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRelayProcess$", "-test.v")
		cmd.Env = append(os.Environ(),
			"ONCEFLOW_TEST_RELAY_DB="+dbURL,
			"ONCEFLOW_TEST_RELAY_BROKERS="+strings.Join(brokers, ","),
			"ONCEFLOW_TEST_RELAY_TOPIC="+topic)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		relays[i] = cmd
		t.Cleanup(func() {
			stdin.Close()
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("relay %d output:\n%s", i, out.String())
			}
		})
	}
	testenv.WaitFor(t, 30*time.Second, "three relays to share the partitions", func() (bool, error) {
		return ownersAndLocks(t, pool) == [2]int{3, outbox.Partitions}, nil
	})

	// 1,000 events on one hot aggregate, interleaved with 50 others.
	want := map[string]int64{}
	total := 0
	for step := 0; step < 1000; step += 10 {
		var evs []event.Envelope
		for i := 0; i < 10; i++ {
			want["hot"]++
			evs = append(evs, newEvent("hot", want["hot"]))
			other := fmt.Sprintf("agg-%02d", (step+i)%50)
			want[other]++
			evs = append(evs, newEvent(other, want[other]))
		}
		enqueue(t, pool, evs...)
		total += len(evs)
		if step == 400 {
			testenv.WaitFor(t, 30*time.Second, "some events to arrive before the kill", func() (bool, error) {
				return c.Distinct() > 200, nil
			})
			if err := relays[0].Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenv.WaitFor(t, 90*time.Second, fmt.Sprintf("all %d events to arrive", total), func() (bool, error) {
		return c.Distinct() == total, nil
	})
	c.CheckOrder(t, want)
	testenv.WaitFor(t, 30*time.Second, "the two survivors to own every partition", func() (bool, error) {
		return ownersAndLocks(t, pool) == [2]int{2, outbox.Partitions}, nil
	})
	t.Logf("%d events in order across 51 aggregates; %d redeliveries after the kill", total, c.Dups())
}

// ownersAndLocks counts the sessions holding outbox partition locks, and the locks.
func ownersAndLocks(t *testing.T, pool *pgxpool.Pool) [2]int {
	t.Helper()
	var owners, locks int
	err := pool.QueryRow(context.Background(), `
		SELECT count(DISTINCT pid), count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND classid = x'6f627831'::int::oid`).Scan(&owners, &locks)
	if err != nil {
		t.Fatal(err)
	}
	return [2]int{owners, locks}
}

func TestARequeueWakesASleepingRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRelayEnv(t, 1, 10)
	pool, c := e.Pool, e.C
	ev := newEvent("w", 1)
	enqueue(t, pool, ev)
	if _, err := pool.Exec(ctx, `UPDATE outbox_events SET state = 'dead', attempts = 10`); err != nil {
		t.Fatal(err)
	}
	// Polling once an hour: only a wake-up can make it publish in time.
	relay, err := outbox.NewRelay(pool, e.W, outbox.RelayConfig{Topic: e.TopicFn, PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer testenv.RunInBackground(t, "Run", relay.Run)()
	testenv.WaitFor(t, 10*time.Second, "the relay to own its partitions", func() (bool, error) {
		return ownersAndLocks(t, pool)[1] == outbox.Partitions, nil
	})
	requeueDeadRows(t, pool, 1)
	testenv.WaitFor(t, 10*time.Second, "the requeued event to be published", func() (bool, error) {
		return c.Distinct() == 1, nil
	})
}

// retryDelays returns the retry_in of every "will retry" line the relay
// logged, in order.
func retryDelays(t *testing.T, logs string) []time.Duration {
	t.Helper()
	var delays []time.Duration
	for _, line := range strings.Split(logs, "\n") {
		var rec struct {
			Msg     string `json:"msg"`
			RetryIn int64  `json:"retry_in"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && strings.Contains(rec.Msg, "will retry") {
			delays = append(delays, time.Duration(rec.RetryIn))
		}
	}
	return delays
}
