package contracts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/segmentio/kafka-go"
	"gopkg.in/yaml.v3"
)

// AsyncAPI is an AsyncAPI 3.0 document loaded for checking records: its
// channels, their messages, and each message's header and payload schemas
// compiled.
type AsyncAPI struct {
	// Doc is the document as decoded JSON values (maps, slices, strings,
	// float64s, bools), for tests that compare it with the code.
	Doc      map[string]any
	Channels map[string]*Channel // by channel id
}

// Channel is one channel of the document.
type Channel struct {
	ID, Address string
	Messages    []*Message
}

// Message is one message a channel may carry.
type Message struct {
	// ID is the message's key under components/messages.
	ID string
	// ContentType is the payload's; only application/json payloads are
	// parsed and validated as JSON.
	ContentType string
	// SameAs maps a header (or "key", the record key) to the header whose
	// value it repeats (x-onceflow-same-as).
	SameAs  map[string]string
	headers *jsonschema.Schema
	payload *jsonschema.Schema
}

// LoadAsyncAPI reads and compiles the document at path. Schemas are
// compiled as JSON Schema draft-07 (what AsyncAPI Schema objects extend)
// with formats (uuid, date-time) asserted.
func LoadAsyncAPI(path string) (*AsyncAPI, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	doc, err := decodeYAML(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	const url = "urn:onceflow:asyncapi"
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.AssertFormat()
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	a := &AsyncAPI{Doc: doc, Channels: map[string]*Channel{}}
	channels, _ := doc["channels"].(map[string]any)
	for id, ch := range channels {
		chm, _ := ch.(map[string]any)
		channel := &Channel{ID: id, Address: str(chm["address"])}
		msgs, _ := chm["messages"].(map[string]any)
		for _, ref := range sortedKeys(msgs) {
			ptr, err := refOf(msgs[ref])
			if err != nil {
				return nil, fmt.Errorf("channel %s message %s: %w", id, ref, err)
			}
			m, err := a.message(c, url, ptr)
			if err != nil {
				return nil, fmt.Errorf("channel %s message %s: %w", id, ref, err)
			}
			channel.Messages = append(channel.Messages, m)
		}
		a.Channels[id] = channel
	}
	return a, nil
}

func (a *AsyncAPI) message(c *jsonschema.Compiler, url, ptr string) (*Message, error) {
	raw, err := Pointer(a.Doc, ptr)
	if err != nil {
		return nil, err
	}
	mm, _ := raw.(map[string]any)
	m := &Message{ID: ptr[strings.LastIndex(ptr, "/")+1:], ContentType: str(mm["contentType"])}
	if m.ContentType == "" {
		m.ContentType = str(a.Doc["defaultContentType"])
	}
	if m.headers, err = c.Compile(url + "#" + ptr + "/headers"); err != nil {
		return nil, fmt.Errorf("compiling headers: %w", err)
	}
	if m.payload, err = c.Compile(url + "#" + ptr + "/payload"); err != nil {
		return nil, fmt.Errorf("compiling payload: %w", err)
	}
	if same, ok := mm["x-onceflow-same-as"]; ok {
		if ref, err := refOf(same); err == nil {
			if same, err = Pointer(a.Doc, ref); err != nil {
				return nil, err
			}
		}
		m.SameAs = map[string]string{}
		for k, v := range same.(map[string]any) {
			m.SameAs[k] = str(v)
		}
	}
	return m, nil
}

// ChannelByAddress returns the channel whose address is topic, or nil.
func (a *AsyncAPI) ChannelByAddress(topic string) *Channel {
	for _, ch := range a.Channels {
		if ch.Address == topic {
			return ch
		}
	}
	return nil
}

// Check validates one record against the messages of the channel: it
// returns the id of the message it is, or an error saying why it is none
// (the errors of the message whose name the record's event-type header
// gives, when there is one, else of each). The record's partition is
// checked against partitions (murmur2 of the key, as Kafka's Java client)
// when partitions > 0; a channel whose messages are JSON must also read as
// a valid CloudEvent (binary mode) through the CloudEvents SDK's Kafka
// binding.
func (ch *Channel) Check(m kafka.Message, partitions int) (string, error) {
	headers, err := HeaderObject(m.Headers)
	if err != nil {
		return "", err
	}
	var errs []error
	for _, msg := range ch.Messages {
		err := msg.check(m, headers)
		if err == nil {
			if msg.ContentType == "application/json" {
				if partitions > 0 {
					if err := checkPartition(m, partitions); err != nil {
						return msg.ID, err
					}
				}
				if err := CheckCloudEvent(m); err != nil {
					return msg.ID, err
				}
			}
			return msg.ID, nil
		}
		errs = append(errs, fmt.Errorf("not %s: %w", msg.ID, err))
	}
	// Narrow the report to the message the record claims to be.
	if et, ok := headers["event-type"].(string); ok {
		var mine []error
		for i, msg := range ch.Messages {
			if strings.HasPrefix(msg.ID, et+"V") {
				mine = append(mine, errs[i])
			}
		}
		if len(mine) > 0 {
			errs = mine
		}
	}
	return "", fmt.Errorf("record %s/%d/%d is no message of channel %s (%s): %w",
		m.Topic, m.Partition, m.Offset, ch.ID, ch.Address, errors.Join(errs...))
}

func (msg *Message) check(m kafka.Message, headers map[string]any) error {
	if err := msg.headers.Validate(headers); err != nil {
		got, _ := json.Marshal(headers)
		return fmt.Errorf("headers %s: %w", got, err)
	}
	for k, from := range msg.SameAs {
		var got string
		if k == "key" {
			got = string(m.Key)
		} else {
			got, _ = headers[k].(string)
		}
		if want, _ := headers[from].(string); got != want {
			return fmt.Errorf("%s is %q, want the %s header's %q", k, got, from, want)
		}
	}
	if msg.ContentType != "application/json" {
		return nil
	}
	payload, err := jsonschema.UnmarshalJSON(bytes.NewReader(m.Value))
	if err != nil {
		return fmt.Errorf("payload is not JSON: %w", err)
	}
	if err := msg.payload.Validate(payload); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	return nil
}

// HeaderObject is the record's headers as the JSON object the header
// schemas describe: each name with its value as text. A header that is not
// UTF-8 or appears twice is an error.
func HeaderObject(hs []kafka.Header) (map[string]any, error) {
	out := make(map[string]any, len(hs))
	for _, h := range hs {
		if _, dup := out[h.Key]; dup {
			return nil, fmt.Errorf("header %s appears more than once", h.Key)
		}
		if !utf8.Valid(h.Value) {
			return nil, fmt.Errorf("header %s is not UTF-8", h.Key)
		}
		out[h.Key] = string(h.Value)
	}
	return out, nil
}

// checkPartition checks the record's partition is the one Kafka's Java
// client picks for its key.
func checkPartition(m kafka.Message, partitions int) error {
	all := make([]int, partitions)
	for i := range all {
		all[i] = i
	}
	if want := (&kafka.Murmur2Balancer{}).Balance(m, all...); want != m.Partition {
		return fmt.Errorf("record %s/%d/%d with key %q is on partition %d; murmur2 of the key picks %d of %d",
			m.Topic, m.Partition, m.Offset, m.Key, m.Partition, want, partitions)
	}
	return nil
}

// CheckCloudEvent reads the record through the CloudEvents SDK's Kafka
// binding (sarama's: the SDK has none for kafka-go, so the record's fields
// are copied into a sarama.ConsumerMessage) and requires a valid
// binary-mode event whose id, type, subject and data are the record's
// envelope and payload.
func CheckCloudEvent(m kafka.Message) error {
	cm := &sarama.ConsumerMessage{Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset, Key: m.Key, Value: m.Value}
	for _, h := range m.Headers {
		cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	msg := kafka_sarama.NewMessageFromConsumerMessage(cm)
	if enc := msg.ReadEncoding(); enc != binding.EncodingBinary {
		return fmt.Errorf("the CloudEvents SDK reads the record's encoding as %v, want binary", enc)
	}
	ev, err := binding.ToEvent(context.Background(), msg)
	if err != nil {
		return fmt.Errorf("the CloudEvents SDK cannot read the record as an event: %w", err)
	}
	if err := ev.Validate(); err != nil {
		return fmt.Errorf("the record is not a valid CloudEvent: %w", err)
	}
	h, _ := HeaderObject(m.Headers)
	for _, c := range [...]struct{ attr, got, header string }{
		{"id", ev.ID(), "event-id"},
		{"type", ev.Type(), "event-type"},
		{"subject", ev.Subject(), "aggregate-id"},
	} {
		if want, _ := h[c.header].(string); c.got != want {
			return fmt.Errorf("CloudEvent %s is %q, want the %s header's %q", c.attr, c.got, c.header, want)
		}
	}
	var data any
	if err := ev.DataAs(&data); err != nil || !bytes.Equal(ev.Data(), m.Value) {
		return fmt.Errorf("the CloudEvent's data is not the record's JSON payload (%v)", err)
	}
	return nil
}

// Pointer resolves a JSON pointer ("/components/messages/X") in doc.
func Pointer(doc any, ptr string) (any, error) {
	cur := doc
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: %q is not in an object", ptr, tok)
		}
		if cur, ok = m[tok]; !ok {
			return nil, fmt.Errorf("%s: no %q", ptr, tok)
		}
	}
	return cur, nil
}

// refOf returns the local JSON pointer of a {$ref: '#/…'} object.
func refOf(v any) (string, error) {
	m, _ := v.(map[string]any)
	ref, ok := m["$ref"].(string)
	if !ok || !strings.HasPrefix(ref, "#/") {
		return "", fmt.Errorf("want a local $ref, got %v", v)
	}
	return ref[1:], nil
}

// decodeYAML decodes a YAML document into JSON values, through JSON, so
// that numbers and maps have the types a JSON decoder gives.
func decodeYAML(raw []byte) (map[string]any, error) {
	var y any
	if err := yaml.Unmarshal(raw, &y); err != nil {
		return nil, err
	}
	j, err := json.Marshal(y)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
	if err != nil {
		return nil, err
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return nil, errors.New("the document is not an object")
	}
	return m, nil
}

func str(v any) string { s, _ := v.(string); return s }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
