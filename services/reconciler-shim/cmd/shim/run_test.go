package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/testinfra"
	shim "github.com/onceflow/onceflow/services/reconciler-shim"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

func paymentEvent(eventType string, orderID uuid.UUID, version int64) event.Envelope {
	body, _ := json.Marshal(map[string]any{
		"paymentId": uuid.New(), "orderId": orderID, "customerId": "c", "amountCents": 700, "currency": "EUR",
		"at": time.Now(),
	})
	return event.Envelope{
		EventID: uuid.New(), EventType: eventType, EventVersion: 1,
		AggregateType: "payment", AggregateID: orderID.String(), AggregateVersion: version,
		OccurredAt: time.Now(), Payload: body,
	}
}

// TestEachPaymentReachesTheThirdPartyOnce runs the shim as in production
// against the stand-in reconciler, with redeliveries and a third party that
// fails its first calls.
func TestEachPaymentReachesTheThirdPartyOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	brokers := testinfra.KafkaBrokers(t)
	topic := testinfra.NewTopic(t, brokers, 3)
	testinfra.NewTopicNamed(t, brokers, topic+".dlt", 1)
	db := testinfra.NewDatabase(t)

	ledger, err := thirdparty.OpenLedger("")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := thirdparty.NewServer(ledger, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(),
		thirdparty.AdminOptions{Token: "test-token"})
	if err != nil {
		t.Fatal(err)
	}
	reconciler, reconcilerAdmin := httptest.NewServer(srv.Public), httptest.NewServer(srv.Admin)
	defer reconciler.Close()
	defer reconcilerAdmin.Close()
	client := thirdparty.NewClient(reconciler.URL, nil).WithAdmin(reconcilerAdmin.URL, "test-token")

	a, b := uuid.New(), uuid.New()
	captureA, captureB := paymentEvent(shim.EventPaymentCaptured, a, 1), paymentEvent(shim.EventPaymentCaptured, b, 1)
	refundA := paymentEvent(shim.EventPaymentRefunded, a, 2)
	// The third party is down for the shim's first two calls.
	if err := client.SetFaults(ctx, thirdparty.Faults{FailNext: 2}); err != nil {
		t.Fatal(err)
	}

	w := kafkautil.NewWriter(brokers, 10)
	defer w.Close()
	var msgs []kafka.Message
	for _, ev := range []event.Envelope{captureA, captureA, captureB, captureA, refundA} {
		msgs = append(msgs, event.ToKafka(topic, ev))
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	// The shim runs with least privilege, as in production: its lease-mode
	// inbox and forwards need only its runtime role.
	roles := pgrolestest.Ensure(t, db, "shim")
	env := roles.ServiceEnv(brokers, map[string]string{
		"BILLING_TOPIC":  topic,
		"CONSUMER_GROUP": testinfra.Name("shim"),
		"RECONCILER_URL": reconciler.URL,
		"LOG_LEVEL":      "debug",
	})
	svc := testinfra.Start(t, run, env)

	pool := testinfra.NewPool(t, db)
	testinfra.WaitFor(t, 60*time.Second, "three forwards recorded", func() (bool, error) {
		n, err := shim.CountForwards(ctx, pool)
		if err != nil && strings.Contains(err.Error(), "does not exist") {
			return false, nil // the shim has not migrated yet
		}
		return n == 3, err
	})

	st := ledger.Stats()
	if st.Settlements != 3 || st.Duplicates != 0 || st.Captures != 2 || st.Refunds != 1 {
		t.Fatalf("third party saw %+v, want 3 settlements (2 captures, 1 refund) and no duplicates", st)
	}

	// /readyz reports the consumer next to the database and Kafka.
	started := svc.WaitRecord(t, 10*time.Second, "reconciler-shim started")
	var ready map[string]string
	if code := testinfra.GetJSON(t, "http://"+testinfra.Addr(t, started, "http_addr")+"/readyz", &ready); code != http.StatusOK || ready["billing_consumer"] != "ok" {
		t.Fatalf("/readyz: %d %v, want 200 with billing_consumer ok", code, ready)
	}
}
