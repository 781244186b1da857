package cdc

import (
	"encoding/hex"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
)

// msgBuilder makes the log-based relay's Kafka messages out of decoded
// envelopes, byte for byte what event.ToKafka makes of the same envelope
// (TestMsgBuilderMatchesToKafka), without its dozen allocations per event:
// an event's key, value and header values are copied once, into a block of
// bytes shared with the events decoded next to it, and its headers are cut
// from a block of headers. Blocks are small (builderBlock), so that the
// events a slow topic keeps in flight pin little besides themselves. Each
// aggregate type's topic is looked up once. Only the streamer's goroutine
// uses a msgBuilder.
type msgBuilder struct {
	topic  func(aggregateType string) string
	topics map[string]aggTopic
	bytes  []byte
	hdrs   []kafka.Header
}

// aggTopic is an aggregate type, its topic and its CloudEvents source,
// made once.
type aggTopic struct {
	aggType, topic string
	source         []byte
}

const (
	// builderBlock is the size of the blocks an event's bytes are cut
	// from; a larger event gets bytes of its own.
	builderBlock = 8 << 10
	// builderHeaders is how many headers a block of headers holds.
	builderHeaders = 256
	// builderTopics bounds the topic cache; past it, a new aggregate
	// type's topic is looked up for each event.
	builderTopics = 1024
)

func newMsgBuilder(topic func(string) string) *msgBuilder {
	return &msgBuilder{topic: topic, topics: map[string]aggTopic{}}
}

// build returns ev as the message the relay publishes, with its aggregate
// (type and id) for ordering.
func (b *msgBuilder) build(ev *rawEnvelope) publish.Claimed {
	at, ok := b.topics[string(ev.aggType)]
	if !ok {
		aggType := string(ev.aggType)
		at = aggTopic{aggType: aggType, topic: b.topic(aggType), source: []byte(event.CloudEventsSource(aggType))}
		if len(b.topics) < builderTopics {
			b.topics[aggType] = at
		}
	}
	optional := [...]struct {
		key   string
		value []byte
	}{
		{event.HeaderCorrelationID, ev.correlationID},
		{event.HeaderCausationID, ev.causationID},
		{event.HeaderTraceparent, ev.traceparent},
	}
	nh := 7 + event.CloudEventsHeaders
	size := uuidText + len(ev.eventType) + maxInt64Text + len(ev.aggType) + len(ev.aggID) + maxInt64Text +
		len(time.RFC3339Nano) + len(ev.payload)
	for _, h := range optional {
		if len(h.value) > 0 {
			nh++
			size += len(h.value)
		}
	}
	f := fieldBuf(b.take(size))
	hdrs := b.headers(nh)
	add := func(key string, value []byte) { hdrs = append(hdrs, kafka.Header{Key: key, Value: value}) }
	id := f.put(appendUUID(f, ev.eventID))
	add(event.HeaderEventID, id)
	typ := f.put(append(f, ev.eventType...))
	add(event.HeaderEventType, typ)
	add(event.HeaderEventVersion, f.put(strconv.AppendInt(f, ev.eventVersion, 10)))
	add(event.HeaderAggregateType, f.put(append(f, ev.aggType...)))
	key := f.put(append(f, ev.aggID...))
	add(event.HeaderAggregateID, key) // the key's bytes: neither is ever written to
	add(event.HeaderAggregateVersion, f.put(strconv.AppendInt(f, ev.aggVersion, 10)))
	occurredAt := f.put(ev.occurredAt.UTC().AppendFormat(f, time.RFC3339Nano))
	add(event.HeaderOccurredAt, occurredAt)
	for _, h := range optional {
		if len(h.value) > 0 {
			add(h.key, f.put(append(f, h.value...)))
		}
	}
	hdrs = event.AppendCloudEvents(hdrs, at.source, id, typ, key, occurredAt)
	value := f.put(append(f, ev.payload...))
	return publish.Claimed{
		AggType:   at.aggType,
		Aggregate: at.aggType + "\x00" + string(ev.aggID),
		Msg:       kafka.Message{Topic: at.topic, Key: key, Value: value, Headers: hdrs},
	}
}

// fieldBuf holds an event's fields one after the other, in the room build
// reserved for them.
type fieldBuf []byte

// put takes grown, f with a field appended, as f, and returns the field
// with no room to grow into what comes next. f has the room build
// reserved, so appending does not reallocate it (and if it did, the fields
// handed out before would stay where they are).
func (f *fieldBuf) put(grown []byte) []byte {
	field := grown[len(*f):len(grown):len(grown)]
	*f = grown
	return field
}

// Upper bounds of the texts build writes.
const (
	uuidText     = 36
	maxInt64Text = 20
)

// take returns an empty slice with room for n bytes.
func (b *msgBuilder) take(n int) []byte {
	if n > builderBlock/4 {
		return make([]byte, 0, n)
	}
	if cap(b.bytes)-len(b.bytes) < n {
		b.bytes = make([]byte, 0, builderBlock)
	}
	l := len(b.bytes)
	b.bytes = b.bytes[:l+n]
	return b.bytes[l : l : l+n]
}

// headers returns an empty slice of headers with room for n, and no more:
// nothing appended to one event's headers can reach the next event's.
func (b *msgBuilder) headers(n int) []kafka.Header {
	if cap(b.hdrs)-len(b.hdrs) < n {
		b.hdrs = make([]kafka.Header, 0, max(builderHeaders, n))
	}
	l := len(b.hdrs)
	b.hdrs = b.hdrs[:l+n]
	return b.hdrs[l : l : l+n]
}

// appendUUID appends u in its canonical form, as uuid.UUID.String.
func appendUUID(dst []byte, u [16]byte) []byte {
	var s [uuidText]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return append(dst, s[:]...)
}
