package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// enqueueInterleaved commits versions 1 to versions of aggregates
// aggregates, named by idFormat from their number, in one transaction:
// every aggregate's version 1, then every one's version 2, and so on. It
// returns each aggregate's last version, as checkOrder wants, and the
// events it committed.
func enqueueInterleaved(t *testing.T, pool *pgxpool.Pool, aggregates int, versions int64, idFormat string) (map[string]int64, []event.Envelope) {
	t.Helper()
	last := map[string]int64{}
	var evs []event.Envelope
	for v := int64(1); v <= versions; v++ {
		for a := range aggregates {
			id := fmt.Sprintf(idFormat, a)
			last[id] = v
			evs = append(evs, newEvent(id, v))
		}
	}
	enqueue(t, pool, evs...)
	return last, evs
}

// A Kafka outage many times longer than MaxAttempts × BackoffMax sends no row
// dead and charges none an attempt: the relay backs off as a whole, says so
// in its metrics and a bounded number of log lines, and publishes everything,
// in order, once the broker is back.
func TestAKafkaOutageIsWaitedOutNotChargedToRows(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 3)
	pool := newOutboxDB(t)
	want, evs := enqueueInterleaved(t, pool, 4, 5, "agg-%d")

	down := testenv.NewWriter([]string{testenv.ClosedAddr(t)}, 100)
	t.Cleanup(func() { down.Close() })
	up := testenv.NewWriter(brokers, 100)
	t.Cleanup(func() { up.Close() })
	w := &switchWriter{}
	w.Current.Store(down)
	reg := prometheus.NewRegistry()
	logs := &testenv.LogBuffer{}
	relay, err := outbox.NewRelay(pool, w, outbox.RelayConfig{
		Topic: func(string) string { return topic },
		// Before the fix, rows went dead after 3 attempts within a second.
		MaxAttempts: 3, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		PollInterval: 50 * time.Millisecond,
		Metrics:      outbox.NewMetrics(reg),
		Logger:       slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay)

	testenv.WaitFor(t, 30*time.Second, "six failed writes, twice MaxAttempts (or a dead row)", func() (bool, error) {
		return w.Writes.Load() >= 6 || countRows(t, pool, "state = 'dead'") > 0, nil
	})
	if n := countRows(t, pool, "state = 'dead'"); n != 0 {
		t.Fatalf("%d rows dead during a Kafka outage, want 0: an outage is not the message's fault", n)
	}
	if n := countRows(t, pool, "state = 'pending' AND attempts = 0"); n != len(evs) {
		t.Fatalf("%d rows pending with no attempt charged, want %d", n, len(evs))
	}
	if got := testenv.MetricValue(t, reg, "outbox_kafka_errors_total"); got < float64(len(evs)) {
		t.Errorf("outbox_kafka_errors_total = %v, want >= %d", got, len(evs))
	}
	if got := testenv.MetricValue(t, reg, "outbox_publish_failures_total"); got != 0 {
		t.Errorf("outbox_publish_failures_total = %v during an outage, want 0 (no message failed)", got)
	}
	if got := testenv.MetricValue(t, reg, "outbox_kafka_connected"); got != 0 {
		t.Errorf("outbox_kafka_connected = %v during the outage, want 0", got)
	}
	if n := strings.Count(logs.String(), "publishing to Kafka failed"); n != 1 {
		t.Errorf("%d lines about the outage's start, want exactly 1 (bounded-rate logging):\n%s", n, logs.String())
	}

	c := collect(t, brokers, topic)
	w.Current.Store(up) // Kafka is back
	testenv.WaitFor(t, 30*time.Second, "every event to be published after the outage", func() (bool, error) {
		return c.Distinct() == len(evs) && countRows(t, pool, "state = 'published'") == len(evs), nil
	})
	c.CheckOrder(t, want)
	if got := testenv.MetricValue(t, reg, "outbox_kafka_connected"); got != 1 {
		t.Errorf("outbox_kafka_connected = %v after recovery, want 1", got)
	}
	if _, ok := logs.Record("outbox relay: publishing to Kafka works again"); !ok {
		t.Errorf("no line about the recovery:\n%s", logs.String())
	}
}

// A topic that does not exist yet (the broker answers
// UnknownTopicOrPartition, as it does while a topic is being created) is
// about the broker, not the message: its rows wait, uncharged, while other
// topics flow, and go out once the topic exists, without a requeue.
func TestAMissingTopicIsWaitedOutWhileOtherTopicsFlow(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	good := testenv.NewTopic(t, brokers, 1)
	missing := testenv.Name("missing")
	pool := newOutboxDB(t)
	route := func(aggregateType string) string {
		if aggregateType == "ghost" {
			return missing
		}
		return good
	}
	ghost1, ghost2 := newEvent("g", 1), newEvent("g", 2)
	ghost1.AggregateType, ghost2.AggregateType = "ghost", "ghost"
	enqueue(t, pool, ghost1, ghost2, newEvent("fine", 1))

	w := testenv.NewWriter(brokers, 10)
	t.Cleanup(func() { w.Close() })
	logs := &testenv.LogBuffer{}
	relay, err := outbox.NewRelay(pool, w, outbox.RelayConfig{
		Topic: route, MaxAttempts: 2, BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		OutageBackoffMax: 500 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay)
	testenv.WaitFor(t, 30*time.Second, "the other topic's event to be published", func() (bool, error) {
		return countRows(t, pool, "state = 'published' AND aggregate_id = 'fine'") == 1, nil
	})
	testenv.WaitFor(t, 30*time.Second, "the missing topic's first event to be deferred", func() (bool, error) {
		return countRows(t, pool, "last_error LIKE '%Unknown Topic Or Partition%'") >= 1, nil
	})
	// The other topic keeps flowing while the missing one is retried.
	for v := int64(2); v <= 6; v++ {
		enqueue(t, pool, newEvent("fine", v))
		testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("fine v%d to be published", v), func() (bool, error) {
			return countRows(t, pool, "state = 'published' AND aggregate_id = 'fine'") == int(v), nil
		})
	}
	if n := countRows(t, pool, "aggregate_id = 'g' AND state = 'pending' AND attempts = 0"); n != 2 {
		t.Fatalf("%d of the missing topic's events pending with no attempt charged, want 2", n)
	}
	// Batches alternate between the missing topic alone (nothing reached
	// Kafka) and the other one: the log must not get a pair of lines per flap.
	if n := strings.Count(logs.String(), "publishing to Kafka failed"); n > 1 {
		t.Errorf("%d lines about Kafka failing, want at most 1 (bounded-rate logging):\n%s", n, logs.String())
	}

	testenv.NewTopicNamed(t, brokers, missing, 1)
	c := collect(t, brokers, missing)
	testenv.WaitFor(t, 30*time.Second, "the waiting events to go out once the topic exists", func() (bool, error) {
		return c.Distinct() == 2, nil
	})
	c.CheckOrder(t, map[string]int64{"g": 2})
}

// slowWriter takes delay per write, as a slow or distant broker would, so
// that a relay stays busy for as long as it has a backlog.
type slowWriter struct {
	w     outbox.Writer
	delay time.Duration
}

func (s slowWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(s.delay):
	}
	return s.w.WriteMessages(ctx, msgs...)
}

// A relay busy with a backlog for much longer than RelayTTL keeps
// heartbeating, keeps its backlog gauges moving (so the backlog-age alert can
// fire while it falls behind), and gives a relay that joins mid-backlog its
// share of the partitions; both publish, and every aggregate stays in order
// across the handover.
func TestABusyRelayHeartbeatsReportsItsBacklogAndShares(t *testing.T) {
	ctx := context.Background()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 6)
	pool := newOutboxDB(t)
	want, evs := enqueueInterleaved(t, pool, 60, 8, "agg-%02d")
	c := collect(t, brokers, topic)

	kw := testenv.NewWriter(brokers, 10)
	t.Cleanup(func() { kw.Close() })
	slow := slowWriter{w: kw, delay: 200 * time.Millisecond}
	// 480 rows, 10 a batch, 200ms a batch: one relay alone is busy ~10s,
	// twenty times its RelayTTL.
	newRelay := func(id string, reg prometheus.Registerer) *outbox.Relay {
		relay, err := outbox.NewRelay(pool, slow, outbox.RelayConfig{
			ID: id, Topic: func(string) string { return topic }, BatchSize: 10,
			RebalanceInterval: 100 * time.Millisecond, RelayTTL: 500 * time.Millisecond,
			Metrics: outbox.NewMetrics(reg),
		})
		if err != nil {
			t.Fatal(err)
		}
		return relay
	}
	reg1, reg2 := prometheus.NewRegistry(), prometheus.NewRegistry()
	runRelay(t, newRelay("busy-1", reg1))

	testenv.WaitFor(t, 20*time.Second, "the first relay to be busy", func() (bool, error) {
		return testenv.MetricValue(t, reg1, "outbox_published_total") > 0, nil
	})
	heartbeat := func() (time.Time, error) {
		var at time.Time
		err := pool.QueryRow(ctx, `SELECT coalesce(max(heartbeat_at), '-infinity') FROM outbox_relays WHERE id = 'busy-1'`).Scan(&at)
		return at, err
	}
	first, err := heartbeat()
	if err != nil {
		t.Fatal(err)
	}
	firstAge := testenv.MetricValue(t, reg1, "outbox_oldest_pending_age_seconds")
	testenv.WaitFor(t, 10*time.Second, "the busy relay's heartbeat to advance past twice its TTL", func() (bool, error) {
		at, err := heartbeat()
		return at.Sub(first) > time.Second, err
	})
	if got := testenv.MetricValue(t, reg1, "outbox_oldest_pending_age_seconds"); got < firstAge+0.5 {
		t.Fatalf("outbox_oldest_pending_age_seconds went from %v to %v over more than a second of backlog: frozen while busy", firstAge, got)
	}
	if n := countRows(t, pool, "state = 'pending'"); n < 100 {
		t.Fatalf("only %d rows left: the backlog must last into the second relay's arrival; slow the writer", n)
	}

	runRelay(t, newRelay("busy-2", reg2))
	testenv.WaitFor(t, 20*time.Second, "both relays to own partitions and publish", func() (bool, error) {
		return testenv.MetricValue(t, reg1, "outbox_owned_partitions") > 0 &&
			testenv.MetricValue(t, reg2, "outbox_owned_partitions") > 0 &&
			testenv.MetricValue(t, reg2, "outbox_published_total") > 0, nil
	})
	testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("all %d events to arrive", len(evs)), func() (bool, error) {
		return c.Distinct() == len(evs), nil
	})
	c.CheckOrder(t, want)
	t.Logf("published: busy-1 %v, busy-2 %v; redeliveries %d",
		testenv.MetricValue(t, reg1, "outbox_published_total"), testenv.MetricValue(t, reg2, "outbox_published_total"), c.Dups())
}

// A Postgres outage does not end Run: the relay's claim loop, heartbeat,
// listener and gauges wait it out with backoff, log each failure once (not
// once per retry), and the relay publishes what was committed meanwhile once
// the database is back.
func TestAPostgresOutageIsWaitedOut(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 1)
	dbURL := newOutboxDBURL(t)
	direct := testenv.NewPool(t, dbURL)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	c := collect(t, brokers, topic)

	w := testenv.NewWriter(brokers, 10)
	t.Cleanup(func() { w.Close() })
	reg := prometheus.NewRegistry()
	logs := &testenv.LogBuffer{}
	relay, err := outbox.NewRelay(testenv.NewPool(t, u.String()), w, outbox.RelayConfig{
		Topic: func(string) string { return topic }, PollInterval: 50 * time.Millisecond,
		RebalanceInterval: 100 * time.Millisecond, OutageBackoffMax: 300 * time.Millisecond,
		Metrics: outbox.NewMetrics(reg), Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	enqueue(t, direct, newEvent("a", 1), newEvent("a", 2))
	testenv.WaitFor(t, 20*time.Second, "the first events to be published", func() (bool, error) {
		return c.Distinct() == 2, nil
	})

	proxy.Cut()
	enqueue(t, direct, newEvent("a", 3), newEvent("a", 4)) // committed while the relay cannot see the database
	testenv.WaitFor(t, 20*time.Second, "the relay to fail heartbeats and gauges for a while", func() (bool, error) {
		return testenv.LabeledMetricValue(t, reg, "outbox_db_errors_total", map[string]string{"op": "heartbeat"}) >= 5 &&
			testenv.LabeledMetricValue(t, reg, "outbox_db_errors_total", map[string]string{"op": "gauges"}) >= 3, nil
	})
	select {
	case err := <-done:
		t.Fatalf("Run returned during a Postgres outage: %v", err)
	default:
	}
	if relay.Health().PostgresConnected {
		t.Errorf("Health() = %+v during the outage, want PostgresConnected false", relay.Health())
	}

	proxy.Heal()
	testenv.WaitFor(t, 30*time.Second, "the events committed during the outage to be published", func() (bool, error) {
		return c.Distinct() == 4, nil
	})
	c.CheckOrder(t, map[string]int64{"a": 4})
	for _, what := range []string{"heartbeating in Postgres", "refreshing the backlog gauges"} {
		if n := strings.Count(logs.String(), "outbox relay: "+what+" failed; retrying with backoff"); n != 1 {
			t.Errorf("%q: %d lines about the outage's start, want 1 (bounded-rate logging)", what, n)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the recovery to be logged and reported", func() (bool, error) {
		_, ok := logs.Record("outbox relay: heartbeating in Postgres works again")
		return ok && relay.Health().PostgresConnected, nil
	})
}
