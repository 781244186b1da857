package event

import (
	"net/url"

	"github.com/segmentio/kafka-go"
)

// CloudEvents binary-mode headers, as the CloudEvents Kafka protocol binding
// (v1.0) names them. The relays add them beside the platform's own headers,
// so that a consumer that speaks CloudEvents (Knative, Dapr, Azure Event
// Grid, the CloudEvents SDKs) reads a record as an event without knowing
// the platform; the record's value stays the bare payload, as binary mode
// requires. Each one repeats a platform header, so the two never disagree:
//
//	ce_specversion  CloudEventsSpecVersion
//	ce_id           event-id
//	ce_source       CloudEventsSource(aggregate-type)
//	ce_type         event-type
//	ce_subject      aggregate-id (the record's key)
//	ce_time         occurred-at (RFC 3339, UTC)
//
// FromKafka ignores them: the platform's headers stay the source of truth.
const (
	HeaderCESpecVersion = "ce_specversion"
	HeaderCEID          = "ce_id"
	HeaderCESource      = "ce_source"
	HeaderCEType        = "ce_type"
	HeaderCESubject     = "ce_subject"
	HeaderCETime        = "ce_time"
)

// CloudEventsSpecVersion is the CloudEvents version the headers follow.
const CloudEventsSpecVersion = "1.0"

// CloudEventsSourcePrefix starts every ce_source. A team that copies the
// platform puts its own name here (and in the Debezium connector's
// InsertHeader literal, which docs/contracts.md names).
const CloudEventsSourcePrefix = "/onceflow/"

// CloudEventsSource is the ce_source of the events of aggregateType: the
// stream of one kind of entity ("/onceflow/order"), a URI reference as the
// spec requires. Event ids are UUIDs, so (source, id) is unique whatever
// the source.
func CloudEventsSource(aggregateType string) string {
	return CloudEventsSourcePrefix + url.PathEscape(aggregateType)
}

// specVersion is ce_specversion's value, shared by every record: header
// values are only ever read (kafka-go, the relays' setHeader copies).
var specVersion = []byte(CloudEventsSpecVersion)

// AppendCloudEvents appends the CloudEvents headers to h, from the values of
// the platform headers they repeat (the same bytes, shared, not copied) and
// source, CloudEventsSource of the aggregate type. ToKafka and the
// log-based relay's message builder both build them here.
func AppendCloudEvents(h []kafka.Header, source, eventID, eventType, aggregateID, occurredAt []byte) []kafka.Header {
	return append(h,
		kafka.Header{Key: HeaderCESpecVersion, Value: specVersion},
		kafka.Header{Key: HeaderCEID, Value: eventID},
		kafka.Header{Key: HeaderCESource, Value: source},
		kafka.Header{Key: HeaderCEType, Value: eventType},
		kafka.Header{Key: HeaderCESubject, Value: aggregateID},
		kafka.Header{Key: HeaderCETime, Value: occurredAt},
	)
}

// CloudEventsHeaders is how many headers AppendCloudEvents appends.
const CloudEventsHeaders = 6
