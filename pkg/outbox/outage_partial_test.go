package outbox_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// "Publishing to Kafka works again" only once every partition the relay
// writes takes writes again: while some still refuse (a topic that does not
// exist yet here; on a cluster, the partitions led by a broker the relay can
// no longer reach) the others' successes are no recovery. Before the fix
// the relay announced the recovery on the first batch any partition took,
// while the refused events still waited.
func TestKafkaWorksAgainOnlyWhenEveryPartitionTakesWrites(t *testing.T) {
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
	ghost := newEvent("g", 1)
	ghost.AggregateType = "ghost"
	enqueue(t, pool, ghost)

	w := testenv.NewWriter(brokers, 10)
	t.Cleanup(func() { w.Close() })
	logs := &testenv.LogBuffer{}
	relay, err := outbox.NewRelay(pool, w, outbox.RelayConfig{
		Topic: route, BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		OutageBackoffMax: 300 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay)
	testenv.WaitFor(t, 30*time.Second, "the outage to be announced", func() (bool, error) {
		return strings.Contains(logs.String(), "publishing to Kafka failed"), nil
	})

	// The other topic flows, batch after batch, while the ghost still waits.
	for v := int64(1); v <= 5; v++ {
		enqueue(t, pool, newEvent("fine", v))
		testenv.WaitFor(t, 30*time.Second, "fine to be published", func() (bool, error) {
			return countRows(t, pool, "state = 'published' AND aggregate_id = 'fine'") == int(v), nil
		})
	}
	if n := countRows(t, pool, "aggregate_id = 'g' AND state = 'pending'"); n != 1 {
		t.Fatalf("%d ghost events pending, want 1", n)
	}
	if _, ok := logs.Record("outbox relay: publishing to Kafka works again"); ok {
		t.Fatalf("the relay says Kafka works again while %s still refuses its event:\n%s", missing, logs.String())
	}

	testenv.NewTopicNamed(t, brokers, missing, 1)
	testenv.WaitFor(t, 30*time.Second, "the ghost to be published and the recovery announced", func() (bool, error) {
		_, ok := logs.Record("outbox relay: publishing to Kafka works again")
		return ok && countRows(t, pool, "state = 'published' AND aggregate_id = 'g'") == 1, nil
	})
}
