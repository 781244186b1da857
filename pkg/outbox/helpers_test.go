package outbox_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/testenv"
)

// relayEnv is what most relay tests start from: a fresh outbox database, a
// topic with a collector reading it, and a writer to the brokers.
type relayEnv struct {
	brokers []string
	topic   string
	url     string // the database's
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
	e.url = newOutboxDBURL(t)
	e.pool = testenv.NewPool(t, e.url)
	e.c = collect(t, e.brokers, e.topic)
	e.w = testenv.NewWriter(e.brokers, batchSize)
	t.Cleanup(func() { e.w.Close() })
	return e
}

// topicFn routes every event to the env's topic (RelayConfig.Topic).
func (e *relayEnv) topicFn(string) string { return e.topic }

// countingPool opens a second pool on the env's database whose connections
// count their claims, statements and round trips, for the relay under test:
// a test of what the relay costs Postgres need not take its word for it.
func (e *relayEnv) countingPool(t *testing.T) (*pgxpool.Pool, *benchWireCounts) {
	t.Helper()
	counts := &benchWireCounts{}
	return benchCountingPool(t, e.url, 4, counts), counts
}
