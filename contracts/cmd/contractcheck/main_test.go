package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// The command over a topic of real records, as a relay publishes them
// (event.ToKafka, murmur2): all valid; then one record whose payload lost a
// field: named, and the command fails.
func TestContractcheckNamesARecordOffTheContract(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	brokers := testinfra.KafkaBrokers(t)
	topic := testinfra.NewTopic(t, brokers, 3)
	if err := kafkautil.WaitTopicsReady(ctx, brokers, topic); err != nil {
		t.Fatal(err)
	}
	w := kafkautil.NewWriter(brokers, 10)
	defer w.Close()
	placed := func(payload string) event.Envelope {
		id := uuid.NewString()
		return event.Envelope{EventID: event.NewID(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
			AggregateID: id, AggregateVersion: 1, OccurredAt: time.Now(), CorrelationID: "r-1", CausationID: "r-1",
			Payload: json.RawMessage(strings.ReplaceAll(payload, "ID", id))}
	}
	const good = `{"orderId":"ID","customerId":"c-1","amountCents":1999,"currency":"EUR","placedAt":"2026-06-08T09:14:32Z"}`
	for range 5 {
		if err := w.WriteMessages(ctx, event.ToKafka(topic, placed(good))); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"-brokers", strings.Join(brokers, ","), "-asyncapi", "../../../docs/asyncapi.yaml", topic + "=ordersEvents"}
	var out bytes.Buffer
	if err := run(ctx, args, &out); err != nil {
		t.Fatalf("over valid records: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "OrderPlacedV1:5") {
		t.Errorf("output does not count the 5 OrderPlaced records:\n%s", out.String())
	}

	bad := placed(strings.Replace(good, `"currency":"EUR",`, "", 1))
	if err := w.WriteMessages(ctx, event.ToKafka(topic, bad)); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err := run(ctx, args, &out)
	if err == nil || !strings.Contains(out.String(), "missing property 'currency'") {
		t.Fatalf("with a record without currency: %v\n%s", err, out.String())
	}
	t.Logf("%v\n%s", err, out.String())
}
