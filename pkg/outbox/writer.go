package outbox

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// Writer is the part of *kafka.Writer the relays need. It must return only
// after the broker acknowledged (RequiredAcks = RequireAll). A *kafka.Writer
// or a wrapper with KafkaWriter() *kafka.Writer is given no more in one call
// than fits one record batch per partition, so that the broker judges an
// aggregate's events of the call together; a Writer of another type that
// splits calls must keep each key's messages of one call together itself.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}
