package contracts_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/contracts"
	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/services/billing"
	"github.com/onceflow/onceflow/services/orders"
)

// asyncAPIPath is the document under test, from this module's directory.
const asyncAPIPath = "../docs/asyncapi.yaml"

func loadAsyncAPI(t *testing.T) *contracts.AsyncAPI {
	t.Helper()
	a, err := contracts.LoadAsyncAPI(asyncAPIPath)
	if err != nil {
		t.Fatalf("loading %s: %v", asyncAPIPath, err)
	}
	return a
}

// goEvent is one event the code publishes: its type and version as the
// producers write them, its aggregate type, and the Go type of its payload.
type goEvent struct {
	eventType     string
	version       int
	aggregateType string
	payload       any // a value of the payload's Go type, every field set
	channel       string
}

// goEvents are the events the services publish, named by their Go
// constants. The consumers (billing, the shim) register no upcasters and
// accept version 1 only (billing.unknownVersion, the shim's "knows 1"), so
// version 1 is every version any consumer accepts. A new event type or
// version is added here, beside the constant, and to the document.
func goEvents() []goEvent {
	now := time.Date(2026, 6, 8, 9, 14, 32, 118123000, time.UTC)
	payment := billing.Payment{PaymentID: uuid.New(), OrderID: uuid.New(), CustomerID: "c-1", AmountCents: 1999,
		Currency: "EUR", At: now, OrderEventAt: now.Add(-time.Second)}
	return []goEvent{
		{orders.EventOrderPlaced, 1, orders.AggregateType, orders.OrderPlaced{OrderID: uuid.New(), CustomerID: "c-1",
			AmountCents: 1999, Currency: "EUR", PlacedAt: now}, "ordersEvents"},
		{orders.EventOrderCancelled, 1, orders.AggregateType, orders.OrderCancelled{OrderID: uuid.New(), CancelledAt: now}, "ordersEvents"},
		{billing.EventPaymentCaptured, 1, billing.AggregateType, payment, "billingEvents"},
		{billing.EventPaymentRefunded, 1, billing.AggregateType, payment, "billingEvents"},
	}
}

// envelopeOf is e as its producer's relay publishes it: every field set.
func envelopeOf(t *testing.T, e goEvent) event.Envelope {
	t.Helper()
	body, err := json.Marshal(e.payload)
	if err != nil {
		t.Fatal(err)
	}
	return event.Envelope{
		EventID: event.NewID(), EventType: e.eventType, EventVersion: e.version,
		AggregateType: e.aggregateType, AggregateID: uuid.NewString(), AggregateVersion: 3,
		OccurredAt:    time.Date(2026, 6, 8, 9, 14, 32, 118123000, time.FixedZone("CEST", 2*3600)),
		CorrelationID: uuid.NewString(), CausationID: uuid.NewString(),
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Payload:     body,
	}
}

// TestEveryGoEventIsAMessageOfTheDocument: each event the code publishes,
// built by event.ToKafka as every relay mode publishes it (the log-based
// relay's builder is byte for byte the same: TestMsgBuilderMatchesToKafka),
// is exactly one message of its channel, and the CloudEvents SDK reads it;
// and the document has no event message the code does not publish.
func TestEveryGoEventIsAMessageOfTheDocument(t *testing.T) {
	a := loadAsyncAPI(t)
	documented := map[string]bool{}
	for _, id := range []string{"ordersEvents", "billingEvents"} {
		ch := a.Channels[id]
		if ch == nil {
			t.Fatalf("the document has no channel %s", id)
		}
		for _, m := range ch.Messages {
			documented[id+"/"+m.ID] = true
		}
	}
	for _, e := range goEvents() {
		ch := a.Channels[e.channel]
		m := event.ToKafka(ch.Address, envelopeOf(t, e))
		id, err := ch.Check(m, 0)
		if err != nil {
			t.Errorf("%s v%d as the relays publish it: %v", e.eventType, e.version, err)
			continue
		}
		if want := e.eventType + "V1"; id != want {
			t.Errorf("%s v%d validates as message %s, want %s", e.eventType, e.version, id, want)
		}
		delete(documented, e.channel+"/"+id)
	}
	for id := range documented {
		t.Errorf("the document has message %s, which no Go event type publishes", id)
	}
}

// TestEnvelopeHeadersAreTheRelays: the document's envelope headers are
// the header names event.ToKafka writes (the polling relay's, and byte for
// byte the log-based relays'), no more and no fewer, except `id`, which
// only Debezium adds; the required ones are those it always writes.
func TestEnvelopeHeadersAreTheRelays(t *testing.T) {
	a := loadAsyncAPI(t)
	schema, err := contracts.Pointer(a.Doc, "/components/schemas/EnvelopeHeaders")
	if err != nil {
		t.Fatal(err)
	}
	props := schema.(map[string]any)["properties"].(map[string]any)
	var documented, required []string
	for k := range props {
		if k != "id" {
			documented = append(documented, k)
		}
	}
	for _, r := range schema.(map[string]any)["required"].([]any) {
		required = append(required, r.(string))
	}
	full := envelopeOf(t, goEvents()[0])
	bare := full
	bare.CorrelationID, bare.CausationID, bare.Traceparent = "", "", ""
	names := func(e event.Envelope) []string {
		var out []string
		for _, h := range event.ToKafka("t", e).Headers {
			out = append(out, h.Key)
		}
		slices.Sort(out)
		return out
	}
	slices.Sort(documented)
	slices.Sort(required)
	if got := names(full); !slices.Equal(got, documented) {
		t.Errorf("the relays write headers %v;\nthe document's EnvelopeHeaders has %v", got, documented)
	}
	if got := names(bare); !slices.Equal(got, required) {
		t.Errorf("the relays always write headers %v;\nthe document requires %v", got, required)
	}
}

// TestPayloadSchemasAreTheGoTypes: each payload schema's properties are
// the JSON names of its Go type's fields, each required (the types have
// no omitempty: every field is always written), with a JSON type that
// fits the Go type. A renamed, added or removed field fails here before
// any consumer sees it.
func TestPayloadSchemasAreTheGoTypes(t *testing.T) {
	a := loadAsyncAPI(t)
	for _, e := range goEvents() {
		msg, err := contracts.Pointer(a.Doc, "/components/messages/"+e.eventType+"V1/payload")
		if err != nil {
			t.Errorf("%s: %v", e.eventType, err)
			continue
		}
		if ref, ok := msg.(map[string]any)["$ref"].(string); ok {
			if msg, err = contracts.Pointer(a.Doc, strings.TrimPrefix(ref, "#")); err != nil {
				t.Fatal(err)
			}
		}
		schema := msg.(map[string]any)
		props := schema["properties"].(map[string]any)
		var required []string
		for _, r := range schema["required"].([]any) {
			required = append(required, r.(string))
		}
		typ := reflect.TypeOf(e.payload)
		var fields []string
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			fields = append(fields, name)
			if strings.Contains(opts, "omitempty") {
				t.Errorf("%s.%s is omitempty: the schema would have to make it optional", typ, f.Name)
			}
			p, ok := props[name].(map[string]any)
			if !ok {
				t.Errorf("%s v%d: Go field %s.%s (JSON %q) is not in the schema's properties", e.eventType, e.version, typ, f.Name, name)
				continue
			}
			if want, got := jsonType(f.Type), p["type"]; got != want {
				t.Errorf("%s v%d: %q is %v in the schema, %s (%s) in Go", e.eventType, e.version, name, got, want, f.Type)
			}
		}
		slices.Sort(fields)
		keys := make([]string, 0, len(props))
		for k := range props {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		slices.Sort(required)
		if !slices.Equal(fields, keys) || !slices.Equal(fields, required) {
			t.Errorf("%s v%d: Go type %s has JSON fields %v;\nthe schema has properties %v, requires %v", e.eventType, e.version, typ, fields, keys, required)
		}
	}
}

// jsonType is the JSON Schema type encoding/json gives a Go type.
func jsonType(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[uuid.UUID](), reflect.TypeFor[time.Time]():
		return "string"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice, reflect.Array:
		return "array"
	}
	return "object"
}

// TestARecordOffTheContractIsNamed: the checker refuses what breaks the
// document, saying what: a payload field renamed, a header removed, a
// CloudEvents header that disagrees with the envelope, a key that is not
// the aggregate id, a partition murmur2 would not pick.
func TestARecordOffTheContractIsNamed(t *testing.T) {
	a := loadAsyncAPI(t)
	ch := a.Channels["ordersEvents"]
	good := func() event.Envelope { return envelopeOf(t, goEvents()[0]) }
	for _, c := range []struct {
		name, want string
		edit       func(m *kafkaMessage)
	}{
		{"a renamed payload field", "amountCents", func(m *kafkaMessage) {
			m.Value = []byte(strings.Replace(string(m.Value), `"amountCents"`, `"amount_cents"`, 1))
		}},
		{"a removed header", "ce_time", func(m *kafkaMessage) { m.dropHeader("ce_time") }},
		{"a header the document does not know", "x-tenant", func(m *kafkaMessage) { m.setHeader("x-tenant", "t1") }},
		{"ce_id that is not the event id", "ce_id", func(m *kafkaMessage) { m.setHeader("ce_id", uuid.NewString()) }},
		{"a key that is not the aggregate id", "key", func(m *kafkaMessage) { m.Key = []byte("other") }},
		{"an event version nobody accepts", "event-version", func(m *kafkaMessage) { m.setHeader("event-version", "2") }},
		{"a wrong partition", "murmur2", func(m *kafkaMessage) { m.Partition = (m.Partition + 1) % 3 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := kafkaMessage{event.ToKafka(ch.Address, good())}
			m.Partition = murmur2Partition(m.Key, 3)
			if _, err := ch.Check(m.Message, 3); err != nil {
				t.Fatalf("the unedited record fails: %v", err)
			}
			c.edit(&m)
			_, err := ch.Check(m.Message, 3)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Check = %v; want an error naming %q", err, c.want)
			}
			t.Logf("%s: %v", c.name, err)
		})
	}
}

// TestTheCloudEventsSDKReadsARecord: the SDK's Kafka binding reads a record
// as the relays publish it as a valid binary-mode event whose id, type,
// subject and data are the envelope's; without ce_specversion it is no
// CloudEvent at all, and with a ce_time that is not RFC 3339 no valid one.
func TestTheCloudEventsSDKReadsARecord(t *testing.T) {
	m := kafkaMessage{event.ToKafka("orders.events", envelopeOf(t, goEvents()[0]))}
	if err := contracts.CheckCloudEvent(m.Message); err != nil {
		t.Fatalf("the relays' record: %v", err)
	}
	for _, c := range []struct {
		name, want string
		edit       func(m *kafkaMessage)
	}{
		{"without ce_specversion", "binary", func(m *kafkaMessage) { m.dropHeader(event.HeaderCESpecVersion) }},
		{"with a ce_time that is not RFC 3339", "time", func(m *kafkaMessage) { m.setHeader(event.HeaderCETime, "yesterday") }},
		{"without ce_source", "source", func(m *kafkaMessage) { m.dropHeader(event.HeaderCESource) }},
	} {
		e := kafkaMessage{event.ToKafka("orders.events", envelopeOf(t, goEvents()[0]))}
		c.edit(&e)
		err := contracts.CheckCloudEvent(e.Message)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: CheckCloudEvent = %v, want an error about %s", c.name, err, c.want)
			continue
		}
		t.Logf("%s: %v", c.name, err)
	}
}
