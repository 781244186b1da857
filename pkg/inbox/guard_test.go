package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestOneKeyInVersionOrderAcrossWorkersAndStaleEventsSkipped(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var msgs []kafka.Message
	var versions []int64
	for v := int64(1); v <= 1000; v++ {
		msgs = append(msgs, event.ToKafka(f.Topic, inboxtesting.NewEvent("hot", v)))
		// Other keys interleaved, spread over the workers.
		msgs = append(msgs, event.ToKafka(f.Topic, inboxtesting.NewEvent("k"+string(rune('a'+v%7)), (v+6)/7)))
	}
	// An older version re-emitted under a new event id: stale.
	replayed := inboxtesting.NewEvent("hot", 500)
	msgs = append(msgs, event.ToKafka(f.Topic, replayed))
	f.Produce(t, msgs...)

	var mu sync.Mutex
	f.run(t, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		if ev.AggregateID == "hot" {
			mu.Lock()
			versions = append(versions, ev.AggregateVersion)
			mu.Unlock()
		}
		return f.recordEffect(ctx, tx, ev)
	}, inbox.Config{Workers: 4, BatchSize: 50, SkipStale: true}) // the opt-in: skipped, counted

	testenv.WaitFor(t, 60*time.Second, "all 2001 messages", func() (bool, error) {
		return testenv.MetricValue(t, f.Registry, "inbox_processed_total")+
			testenv.MetricValue(t, f.Registry, "inbox_stale_total") == 2001, nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(versions) != 1000 {
		t.Fatalf("hot aggregate handled %d times, want 1000 (the stale replay must be skipped)", len(versions))
	}
	for i, v := range versions {
		if v != int64(i+1) {
			t.Fatalf("hot aggregate: handling %d was version %d, want %d", i, v, i+1)
		}
	}
	if got := testenv.MetricValue(t, f.Registry, "inbox_stale_total"); got != 1 {
		t.Fatalf("inbox_stale_total = %v, want 1", got)
	}
	if n := f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'stale' AND message_id = $1", replayed.EventID); n != 1 {
		t.Fatal("the stale event's inbox row is not marked stale")
	}
}

func TestKilledAfterCommitBeforeOffsetCommitRedeliveryIsANoOp(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := []event.Envelope{inboxtesting.NewEvent("a", 1), inboxtesting.NewEvent("b", 1), inboxtesting.NewEvent("c", 1)}
	var msgs []kafka.Message
	for _, ev := range evs {
		msgs = append(msgs, event.ToKafka(f.Topic, ev))
	}
	f.Produce(t, msgs...)
	group := testenv.Name("group")

	// First life: dies right after its first database commit.
	killed := errors.New("killed")
	c1, err := inbox.NewConsumer(f.Pool, f.Source(group), f.Writer, f.recordEffect, inbox.Config{
		Name: "crashy", Workers: 1, BatchSize: 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	crashAfterCommit := inboxtest.WithCrashPoint(context.Background(), func(name string) error {
		if name == inboxtest.CrashAfterCommit {
			return killed
		}
		return nil
	})
	if err := c1.Run(crashAfterCommit); !errors.Is(err, killed) {
		t.Fatalf("first life ended with %v, want the crash", err)
	}
	firstLife := f.Count(t, "SELECT count(*) FROM effects")
	if firstLife == 0 {
		t.Fatal("the first life committed nothing before the crash point")
	}

	// Second life: the same group gets the uncommitted messages again.
	reg := prometheus.NewRegistry()
	c2, err := inbox.NewConsumer(f.Pool, f.Source(group), f.Writer, f.recordEffect, inbox.Config{
		Name: "crashy", Metrics: inbox.NewMetrics(reg),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c2.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testenv.WaitFor(t, 30*time.Second, "the redeliveries", func() (bool, error) {
		return testenv.MetricValue(t, reg, "inbox_duplicates_total") == float64(firstLife) &&
			f.Count(t, "SELECT count(*) FROM effects") == len(evs), nil
	})
}

func TestUpcastersChainOldVersionsToTheCurrentOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	old := inboxtesting.NewEvent("u", 1)
	old.EventVersion, old.Payload = 1, []byte(`{"amount":5}`)
	f.Produce(t, event.ToKafka(f.Topic, old))
	var got event.Envelope
	var mu sync.Mutex
	f.run(t, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		mu.Lock()
		got = ev
		mu.Unlock()
		return f.recordEffect(ctx, tx, ev)
	}, inbox.Config{Upcasters: []inbox.Upcaster{
		{EventType: "ThingHappened", From: 1, Convert: func(p json.RawMessage) (json.RawMessage, error) {
			var v1 struct{ Amount int64 }
			if err := json.Unmarshal(p, &v1); err != nil {
				return nil, err
			}
			return json.Marshal(map[string]any{"amountCents": v1.Amount * 100})
		}},
		{EventType: "ThingHappened", From: 2, Convert: func(p json.RawMessage) (json.RawMessage, error) {
			var v2 map[string]any
			if err := json.Unmarshal(p, &v2); err != nil {
				return nil, err
			}
			v2["currency"] = "EUR"
			return json.Marshal(v2)
		}},
	}})
	testenv.WaitFor(t, 30*time.Second, "the upcast event", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM effects") == 1, nil
	})
	mu.Lock()
	defer mu.Unlock()
	if got.EventVersion != 3 || string(got.Payload) != `{"amountCents":500,"currency":"EUR"}` {
		t.Fatalf("handler saw v%d %s, want v3 with the converted payload", got.EventVersion, got.Payload)
	}
}

func TestVersionGapsAreReportedOrWaitedFor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.Produce(t, event.ToKafka(f.Topic, inboxtesting.NewEvent("g", 1)), event.ToKafka(f.Topic, inboxtesting.NewEvent("g", 3)))
	f.run(t, f.recordEffect, inbox.Config{AcceptGaps: true})
	testenv.WaitFor(t, 30*time.Second, "both events, the gap reported", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM effects") == 2 &&
			testenv.MetricValue(t, f.Registry, "inbox_version_gaps_total") == 1, nil
	})

	g := newFixture(t)
	dlt := testenv.NewTopic(t, g.Brokers, 1)
	g.Produce(t, event.ToKafka(g.Topic, inboxtesting.NewEvent("g", 1)), event.ToKafka(g.Topic, inboxtesting.NewEvent("g", 3)))
	g.run(t, g.recordEffect, inbox.Config{AcceptGaps: false, MaxAttempts: 3, BackoffMin: time.Millisecond,
		BackoffMax: 2 * time.Millisecond, DeadLetterTopic: dlt})
	testenv.WaitFor(t, 30*time.Second, "the gapped event to be retried, then dead-lettered", func() (bool, error) {
		return testenv.MetricValue(t, g.Registry, "inbox_dead_lettered_total") == 1, nil
	})
	if n := g.Count(t, "SELECT count(*) FROM effects"); n != 1 {
		t.Fatalf("%d effects, want only version 1's", n)
	}
}
