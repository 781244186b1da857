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
