package inbox

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// Writer publishes dead letters; *kafka.Writer satisfies it.
type Writer = engine.Writer

// Dead-letter headers added to the original message's headers.
const (
	HeaderDLTReason    = engine.HeaderDLTReason
	HeaderDLTConsumer  = engine.HeaderDLTConsumer
	HeaderDLTTopic     = engine.HeaderDLTTopic
	HeaderDLTPartition = engine.HeaderDLTPartition
	HeaderDLTOffset    = engine.HeaderDLTOffset
	HeaderDLTFailedAt  = engine.HeaderDLTFailedAt
)

// DeadLetterBodyLimit is how much of a message's value a dead letter keeps
// when the dead-letter topic refuses the whole message (too large for the
// writer or the topic): the record then carries the first DeadLetterBodyLimit
// bytes and the HeaderDLTTruncated header, so the partition can move on and
// the message is still visible, with its coordinates, for an operator.
const DeadLetterBodyLimit = engine.DeadLetterBodyLimit

// HeaderDLTTruncated, on a dead letter, holds the original value's size in
// bytes when the value was cut to DeadLetterBodyLimit.
const HeaderDLTTruncated = engine.HeaderDLTTruncated
