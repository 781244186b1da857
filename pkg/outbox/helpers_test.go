package outbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/testenv"
)

// relayEnv is what most relay tests start from: a fresh outbox database, a
// topic with a collector reading it, and a writer to the brokers.
type relayEnv struct {
	brokers []string
	topic   string
	pool    *pgxpool.Pool
	c       *collector
	w       *testenv.Writer
}

// newRelayEnv makes a relayEnv with a topic of the given partitions and a
// writer of the given batch size, closed when the test ends.
func newRelayEnv(t *testing.T, partitions, batchSize int) *relayEnv {
	t.Helper()
	e := &relayEnv{brokers: testenv.KafkaBrokers(t)}
	e.topic = testenv.NewTopic(t, e.brokers, partitions)
	e.pool = newOutboxDB(t)
	e.c = collect(t, e.brokers, e.topic)
	e.w = testenv.NewWriter(e.brokers, batchSize)
	t.Cleanup(func() { e.w.Close() })
	return e
}

// topicFn routes every event to the env's topic (RelayConfig.Topic).
func (e *relayEnv) topicFn(string) string { return e.topic }

// runInBackground runs run (a relay's, a pruner's or a watcher's Run) on its
// own goroutine until the returned stop is called or the test or benchmark
// ends, whichever comes first. stop cancels run's context, waits for run to
// return and reports an error it returned under name: Run returns nil when
// its context ends, so anything else is a failure. stop may be called more
// than once; only the first call stops.
func runInBackground(tb testing.TB, name string, run func(ctx context.Context) error) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("%s: %v", name, err)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
