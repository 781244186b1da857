package inbox

import (
	"context"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// DeadLetter describes one message of a dead-letter topic, from the headers
// the consumer added when it gave up on the message. Fields whose header is
// missing or unreadable keep their zero value; the Original coordinates are
// then -1.
type DeadLetter = engine.DeadLetter

// DefaultListLimit is how many dead letters (ListDeadLetters) or parked
// messages (ListParked) a listing returns when its limit is zero.
const DefaultListLimit = engine.DefaultListLimit

// ListDeadLetters returns up to limit dead letters of dltTopic, oldest
// first (by the time each was appended; the order within a partition is
// kept). A zero limit means DefaultListLimit; a negative one is refused.
//
// It reads every partition from its first offset up to its high-water mark
// at the time of the call, with plain partition readers: no consumer group,
// no committed offset, so listing changes nothing and can be repeated. Dead
// letters stay in the topic after a requeue (Kafka topics are append-only);
// they leave it only through the topic's retention. Whether one is still
// pending is in the inbox: its consumer's dead_lettered row.
//
// WithDialer connects with a TLS/SASL dialer; the default is plain TCP.
func ListDeadLetters(ctx context.Context, brokers []string, dltTopic string, limit int, opts ...AdminOption) ([]DeadLetter, error) {
	return engine.ListDeadLetters(ctx, brokers, dltTopic, limit, opts...)
}
