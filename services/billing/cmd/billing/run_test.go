package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/billing"
)

// TestOrderEventThroughTheBrokerIsChargedOnce runs billing as it runs in
// production and feeds it the way orders does: an OrderPlaced committed to an
// outbox, published by the relay through the real broker. The same event is
// then delivered again; billing must absorb it. Billing runs as in
// production with least privilege too: migrated by its owner role, run by a
// runtime role that has no DDL, so this shows the consumer, the outbox and
// its relay need nothing more.
func TestOrderEventThroughTheBrokerIsChargedOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	brokers := testinfra.KafkaBrokers(t)
	ordersTopic := testinfra.NewTopic(t, brokers, 3)
	testinfra.NewTopicNamed(t, brokers, ordersTopic+".dlt", 1)
	billingTopic := testinfra.NewTopic(t, brokers, 3)
	billingDB := testinfra.NewDatabase(t)

	// The orders side: an outbox and its relay in a database of their own.
	ordersPool := outboxtest.NewDatabase(t)
	orderID := uuid.New()
	placed := event.Envelope{
		EventID: uuid.New(), EventType: billing.EventOrderPlaced, EventVersion: 1,
		AggregateType: "order", AggregateID: orderID.String(), AggregateVersion: 1, OccurredAt: time.Now(),
		CorrelationID: "req-7",
		Payload:       json.RawMessage(`{"orderId":"` + orderID.String() + `","customerId":"c","amountCents":1234,"currency":"USD"}`),
	}
	if err := pgx.BeginFunc(ctx, ordersPool, func(tx pgx.Tx) error { return outbox.Enqueue(ctx, tx, placed) }); err != nil {
		t.Fatal(err)
	}
	w := kafkautil.NewWriter(brokers, 10)
	defer w.Close()
	relay, err := outbox.NewRelay(ordersPool, w, outbox.RelayConfig{Topic: func(string) string { return ordersTopic }})
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() { stopRelay(); <-relayDone }() // before w.Close: deferred later, runs first
	testinfra.WaitFor(t, 30*time.Second, "the relay to publish the OrderPlaced", func() (bool, error) {
		return len(outboxtest.Enqueued(t, ordersPool, outboxtest.Match{EventType: billing.EventOrderPlaced, State: "published"})) == 1, nil
	})

	// Billing, wired exactly as in production.
	roles := pgrolestest.Ensure(t, billingDB, "billing")
	env := roles.ServiceEnv(brokers, map[string]string{
		"ORDERS_TOPIC":   ordersTopic,
		"BILLING_TOPIC":  billingTopic,
		"CONSUMER_GROUP": testinfra.Name("billing"),
		"LOG_LEVEL":      "debug",
	})
	svc := testinfra.Start(t, run, env)

	// PaymentCaptured comes out the other side, through billing's outbox and relay.
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: billingTopic, GroupID: testinfra.Name("check"), MaxWait: 100 * time.Millisecond})
	defer r.Close()
	m, err := r.FetchMessage(ctx)
	if err != nil {
		t.Fatalf("waiting for PaymentCaptured: %v\n%s", err, svc.Logs.String())
	}
	captured, err := event.FromKafka(m)
	if err != nil {
		t.Fatal(err)
	}
	if captured.EventType != billing.EventPaymentCaptured || captured.AggregateID != orderID.String() ||
		captured.CausationID != placed.EventID.String() || captured.CorrelationID != "req-7" {
		t.Fatalf("got %s for %s caused by %s (correlation %q)", captured.EventType, captured.AggregateID, captured.CausationID, captured.CorrelationID)
	}

	// Redeliver the very same event; billing must count it as a duplicate.
	if err := w.WriteMessages(ctx, event.ToKafka(ordersTopic, placed)); err != nil {
		t.Fatal(err)
	}
	billingPool := testinfra.NewPool(t, billingDB)
	testinfra.WaitFor(t, 30*time.Second, "the redelivery to be recorded as a duplicate", func() (bool, error) {
		return strings.Contains(svc.Logs.String(), `"msg":"inbox duplicate"`), nil
	})
	var charges int
	if err := billingPool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&charges); err != nil {
		t.Fatal(err)
	}
	inboxRows := inboxtest.Count(t, billingPool, "")
	if charges != 1 || inboxRows != 1 {
		t.Fatalf("%d charges and %d inbox rows, want 1 and 1", charges, inboxRows)
	}

	// /readyz reports the consumer next to the database and Kafka.
	started := svc.WaitRecord(t, 10*time.Second, "billing started")
	var ready map[string]string
	if code := testinfra.GetJSON(t, "http://"+testinfra.Addr(t, started, "http_addr")+"/readyz", &ready); code != http.StatusOK || ready["orders_consumer"] != "ok" {
		t.Fatalf("/readyz: %d %v, want 200 with orders_consumer ok", code, ready)
	}

	// The owner role migrated; the runtime role owns nothing.
	var owners []string
	if err := pgx.BeginFunc(ctx, billingPool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'`)
		if err != nil {
			return err
		}
		owners, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(owners) != 1 || owners[0] != roles.Spec.Owner.Name {
		t.Fatalf("tables owned by %v, want only %s", owners, roles.Spec.Owner.Name)
	}
}
