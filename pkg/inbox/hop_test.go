package inbox_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// TestHopsAtALowRateAreMeasured sends one event at a time, 100 a second,
// through the real Kafka, and logs each hop: the event's occurredAt (set
// just before it is written) to its handler's start. It asserts that
// inbox_hop_seconds saw every one, not how long they took: timings on a
// shared machine are for the log and for make bench.
func TestHopsAtALowRateAreMeasured(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	reg := prometheus.NewRegistry()
	starts := make(chan time.Time, 1)
	c, err := inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer,
		func(context.Context, pgx.Tx, event.Envelope) error {
			starts <- time.Now()
			return nil
		}, inbox.Config{Name: "hop-test", Metrics: inbox.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	inboxtesting.RunUntilCleanup(t, c)

	var version int64
	send := func() time.Duration {
		t.Helper()
		version++
		ev := inboxtesting.NewEvent("hop", version)
		ev.OccurredAt = time.Now()
		f.Produce(t, event.ToKafka(f.Topic, ev))
		select {
		case start := <-starts:
			return start.Sub(ev.OccurredAt)
		case <-time.After(30 * time.Second):
			t.Fatal("the handler did not start within 30s")
			return 0
		}
	}
	first := send() // joins the group and opens the partition's reader
	const n = 50
	hops := make([]time.Duration, 0, n)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for range n {
		<-tick.C
		hops = append(hops, send())
	}
	slices.Sort(hops)
	t.Logf("hop (occurredAt → handler start), one event at a time at <= 100/s: first %v (includes joining the group); then p50 %v, p90 %v, p99 %v, max %v",
		first.Round(time.Microsecond), hops[n/2].Round(time.Microsecond), hops[n*9/10].Round(time.Microsecond),
		hops[n*99/100].Round(time.Microsecond), hops[n-1].Round(time.Microsecond))
	if got := testenv.MetricValue(t, reg, "inbox_hop_seconds"); got != n+1 {
		t.Fatalf("inbox_hop_seconds has %v observations, want %d", got, n+1)
	}
}
