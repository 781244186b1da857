package inbox

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/dlt"
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// Writer publishes dead letters; *kafka.Writer satisfies it.
type Writer = engine.Writer

// Dead-letter headers added to the original message's headers.
const (
	HeaderDLTReason    = dlt.HeaderDLTReason
	HeaderDLTConsumer  = dlt.HeaderDLTConsumer
	HeaderDLTTopic     = dlt.HeaderDLTTopic
	HeaderDLTPartition = dlt.HeaderDLTPartition
	HeaderDLTOffset    = dlt.HeaderDLTOffset
	HeaderDLTFailedAt  = dlt.HeaderDLTFailedAt
)

// HeaderDLTTruncated is on a dead letter the dead-letter topic refused
// whole (too large for the writer or the topic): it holds the original
// value's size in bytes, and the letter carries the value's first 64 KiB,
// so the partition moves on and the message stays visible, with its
// coordinates, for an operator.
const HeaderDLTTruncated = dlt.HeaderDLTTruncated
