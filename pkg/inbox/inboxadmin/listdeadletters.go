package inboxadmin

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/internal/dlt"
)

// One job per file: listing a dead-letter topic (here), requeuing dead
// letters to their original topic once the cause is fixed (requeue.go; both
// read the topic through internal/dlt), releasing or skipping a held
// aggregate (held.go), and the reads of backlog.go, lookup.go and
// listparked.go. They are meant for an admin endpoint (the platform's
// inboxhttp is one), a CLI or a background worker.

// The headers a consumer adds to a message it gives up on, beside the
// message's own, when it publishes the message to the dead-letter topic:
// why (the error, cut to 4 KiB), which consumer, and where the message was.
// DeadLetter holds them read back.
const (
	HeaderDLTReason    = dlt.HeaderDLTReason
	HeaderDLTConsumer  = dlt.HeaderDLTConsumer
	HeaderDLTTopic     = dlt.HeaderDLTTopic
	HeaderDLTPartition = dlt.HeaderDLTPartition
	HeaderDLTOffset    = dlt.HeaderDLTOffset
	HeaderDLTFailedAt  = dlt.HeaderDLTFailedAt

	// HeaderDLTTruncated is on a dead letter the dead-letter topic refused
	// whole (too large for the writer or the topic): it holds the original
	// value's size in bytes, and the letter carries the value's first 64
	// KiB, so the partition moves on and the message stays visible, with
	// its coordinates, for an operator. RequeueDeadLetters sends the whole
	// original, which the inbox kept.
	HeaderDLTTruncated = dlt.HeaderDLTTruncated
)

// DeadLetter describes one message of a dead-letter topic, from the headers
// the consumer added when it gave up on the message. Fields whose header is
// missing or unreadable keep their zero value; the Original coordinates are
// then -1.
type DeadLetter struct {
	// Partition and Offset locate the dead letter in the dead-letter topic.
	Partition int
	Offset    int64
	// Time is when the dead letter was appended to the dead-letter topic.
	Time time.Time

	// Reason is why the consumer gave up: the decode or handler error.
	Reason string
	// Consumer is the name (inbox.Config.Name) of the consumer that gave up.
	Consumer string
	// OriginalTopic, OriginalPartition and OriginalOffset locate the message
	// where the consumer read it.
	OriginalTopic     string
	OriginalPartition int
	OriginalOffset    int64
	// FailedAt is when the consumer gave up, by its clock.
	FailedAt time.Time

	// EventID, EventType and AggregateID come from the event's own headers;
	// they are empty for a message that is not an event at all.
	EventID     uuid.UUID
	EventType   string
	AggregateID string

	// KeySize and ValueSize are the lengths in bytes of the message's key
	// and value, which this listing leaves out.
	KeySize, ValueSize int
}

func deadLetterOf(m kafka.Message) DeadLetter {
	h := make(map[string]string, len(m.Headers))
	for _, kv := range m.Headers {
		h[kv.Key] = string(kv.Value) // the last one wins: the latest dead-lettering
	}
	dl := DeadLetter{
		Partition: m.Partition, Offset: m.Offset, Time: m.Time,
		Reason: h[dlt.HeaderDLTReason], Consumer: h[dlt.HeaderDLTConsumer], OriginalTopic: h[dlt.HeaderDLTTopic],
		OriginalPartition: -1, OriginalOffset: -1,
		EventType: h[event.HeaderEventType], AggregateID: h[event.HeaderAggregateID],
		KeySize: len(m.Key), ValueSize: len(m.Value),
	}
	if p, err := strconv.Atoi(h[dlt.HeaderDLTPartition]); err == nil {
		dl.OriginalPartition = p
	}
	if o, err := strconv.ParseInt(h[dlt.HeaderDLTOffset], 10, 64); err == nil {
		dl.OriginalOffset = o
	}
	if t, err := time.Parse(time.RFC3339Nano, h[dlt.HeaderDLTFailedAt]); err == nil {
		dl.FailedAt = t
	}
	if id, err := uuid.Parse(h[event.HeaderEventID]); err == nil {
		dl.EventID = id
	}
	return dl
}

// defaultListLimit is how many dead letters (ListDeadLetters) or parked
// messages (ListParked) a listing returns when its limit is zero.
const defaultListLimit = 100

// ListDeadLetters returns up to limit dead letters of dltTopic, oldest
// first (by the time each was appended; the order within a partition is
// kept). A zero limit means 100; a negative one is refused.
//
// It reads every partition from its first offset up to its high-water mark
// at the time of the call, with plain partition readers: no consumer group,
// no committed offset, so listing changes nothing and can be repeated. Dead
// letters stay in the topic after a requeue (Kafka topics are append-only);
// they leave it only through the topic's retention. Whether one is still
// pending is in the inbox: its consumer's dead_lettered row.
//
// WithDialer connects with a TLS/SASL dialer; the default is plain TCP.
func ListDeadLetters(ctx context.Context, brokers []string, dltTopic string, limit int, opts ...Option) ([]DeadLetter, error) {
	if limit < 0 {
		return nil, fmt.Errorf("inbox: ListDeadLetters: the limit is negative (%d); leave it zero for the default", limit)
	}
	if limit == 0 {
		limit = defaultListLimit
	}
	dialer := adminDialer(opts)
	var perPartition [][]DeadLetter
	err := dlt.ReadTopic(ctx, dialer, brokers, dltTopic, func(p int, m kafka.Message) (bool, error) {
		for len(perPartition) <= p {
			perPartition = append(perPartition, nil)
		}
		perPartition[p] = append(perPartition[p], deadLetterOf(m))
		return len(perPartition[p]) < limit, nil
	})
	if err != nil {
		return nil, err
	}
	// Merge the partitions by append time. Each partition contributes at most
	// limit letters, so the oldest limit overall are among them.
	out := []DeadLetter{}
	for len(out) < limit {
		best := -1
		for p, dls := range perPartition {
			if len(dls) > 0 && (best < 0 || dls[0].Time.Before(perPartition[best][0].Time)) {
				best = p
			}
		}
		if best < 0 {
			break
		}
		out = append(out, perPartition[best][0])
		perPartition[best] = perPartition[best][1:]
	}
	return out, nil
}
