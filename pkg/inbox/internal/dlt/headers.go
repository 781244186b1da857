// Package dlt is the inbox's dead letter as data: the headers the consumer
// adds to a message it gives up on, the form a message's headers are kept
// in a table (a parked message, the original of a truncated dead letter),
// and the reading of a dead-letter topic. The consumer writes them
// (internal/engine) and the operator's verbs read them (inboxadmin), so
// they are written down once, here.
package dlt

import (
	"encoding/json"

	"github.com/segmentio/kafka-go"
)

// Dead-letter headers added to the original message's headers.
const (
	HeaderDLTReason    = "dlt-reason"
	HeaderDLTConsumer  = "dlt-consumer"
	HeaderDLTTopic     = "dlt-original-topic"
	HeaderDLTPartition = "dlt-original-partition"
	HeaderDLTOffset    = "dlt-original-offset"
	HeaderDLTFailedAt  = "dlt-failed-at"
)

// HeaderDLTTruncated, on a dead letter, holds the original value's size in
// bytes when the value was cut to its first 64 KiB (the engine's
// DeadLetterBodyLimit).
const HeaderDLTTruncated = "dlt-truncated-from"

// storedHeader is one Kafka header of a parked message, as msg_headers
// keeps it: both fields base64 (json's []byte), since neither needs to be
// valid UTF-8 nor free of NUL bytes, which jsonb refuses.
type storedHeader struct {
	Key   []byte `json:"key"`
	Value []byte `json:"value"`
}

// EncodeHeaders is how park and keepOriginal store a message's headers.
func EncodeHeaders(headers []kafka.Header) ([]byte, error) {
	hs := make([]storedHeader, len(headers))
	for i, h := range headers {
		hs[i] = storedHeader{Key: []byte(h.Key), Value: h.Value}
	}
	return json.Marshal(hs)
}

// DecodeHeaders reads back the headers park stored.
func DecodeHeaders(raw []byte) ([]kafka.Header, error) {
	var hs []storedHeader
	if err := json.Unmarshal(raw, &hs); err != nil {
		return nil, err
	}
	out := make([]kafka.Header, len(hs))
	for i, h := range hs {
		out[i] = kafka.Header{Key: string(h.Key), Value: h.Value}
	}
	return out, nil
}
