package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	kafka "github.com/segmentio/kafka-go" // the package's name is not its path's
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// The caller's trace context: the test plays a client that is itself traced.
const (
	clientTraceID = "5b8efff798038103d269b633813fc60c"
	clientSpanID  = "eee19b7ec3c1b174"
	traceparent   = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// TestOneTraceFromTheHTTPRequestToTheThirdParty places one order with a
// traceparent header and follows it through the four programs, each a built
// binary in its own process exporting its spans over OTLP/HTTP to a
// collector the test runs. The trace id must survive the whole path: the
// outbox rows store it, the Kafka headers carry it, the reconciler books the
// payment under it, and the exported spans form one chain:
//
//	client (the test)
//	└ orders       POST /orders             server
//	  └ orders     send <orders topic>      producer  (the relay, from the outbox row)
//	    └ billing  process <orders topic>   consumer  (the inbox handler)
//	      └ billing send <billing topic>    producer  (billing's relay)
//	        └ shim  process <billing topic> consumer  (lease mode)
//	          └ shim POST                   client    (the call to the third party)
//	            └ reconciler POST /settlements server
func TestOneTraceFromTheHTTPRequestToTheThirdParty(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	collector := testinfra.NewOTLPReceiver(t)
	p := startPlatform(t, "otlp", collector.URL)
	orderID := p.placeTracedOrder(ctx, t)
	// What crossed the process boundaries, read before the spans are known.
	ordersRow, orderHeader, billingRow, billingHeader := p.crossings(ctx, t)
	ordersTopic, billingTopic := p.ordersTopic, p.billingTopic

	// Stopping the programs flushes the spans they still buffer.
	p.stop(t)

	spans := map[string]testinfra.Span{} // span id -> span, this trace only
	for _, s := range collector.Spans() {
		if s.TraceID == clientTraceID {
			spans[s.SpanID] = s
		}
	}
	chain := []struct {
		service, name string
		kind          tracepb.Span_SpanKind
	}{
		{"orders", "POST /orders", tracepb.Span_SPAN_KIND_SERVER},
		{"orders", "send " + ordersTopic, tracepb.Span_SPAN_KIND_PRODUCER},
		{"billing", "process " + ordersTopic, tracepb.Span_SPAN_KIND_CONSUMER},
		{"billing", "send " + billingTopic, tracepb.Span_SPAN_KIND_PRODUCER},
		{"reconciler-shim", "process " + billingTopic, tracepb.Span_SPAN_KIND_CONSUMER},
		{"reconciler-shim", "POST", tracepb.Span_SPAN_KIND_CLIENT},
		{"reconciler", "POST /settlements", tracepb.Span_SPAN_KIND_SERVER},
	}
	found := make([]testinfra.Span, len(chain))
	parent := clientSpanID
	for i, want := range chain {
		var children []testinfra.Span
		for _, s := range spans {
			if s.ParentSpanID == parent && s.Service == want.service && s.Name == want.name && s.Kind == want.kind {
				children = append(children, s)
			}
		}
		if len(children) != 1 {
			t.Fatalf("want one %s span %q (%v) under %s, found %d; the trace has:\n%s",
				want.service, want.name, want.kind, parent, len(children), describe(spans))
		}
		found[i], parent = children[0], children[0].SpanID
		if found[i].Error {
			t.Errorf("%s span %q has an error status", want.service, want.name)
		}
	}
	t.Logf("the trace:\n%s", describe(spans))
	if len(spans) != len(chain) {
		t.Errorf("the trace has %d spans, want the %d of the chain:\n%s", len(spans), len(chain), describe(spans))
	}

	// The stored and sent contexts are those of the spans that wrote them.
	for _, c := range []struct {
		what, got string
		span      testinfra.Span
	}{
		{"the orders outbox row", ordersRow, found[0]},
		{"the orders.events message", orderHeader, found[1]},
		{"the billing outbox row", billingRow, found[2]},
		{"the billing.events message", billingHeader, found[3]},
	} {
		if want := "00-" + clientTraceID + "-" + c.span.SpanID + "-01"; c.got != want {
			t.Errorf("%s carries traceparent %q, want %q (the %s span %q)", c.what, c.got, want, c.span.Service, c.span.Name)
		}
	}
	if id := found[0].Attributes["http.response.status_code"]; id != "201" {
		t.Errorf("the orders server span recorded status %q, want 201", id)
	}
	if key := found[1].Attributes["messaging.kafka.message.key"]; key != orderID {
		t.Errorf("the orders producer span recorded key %q, want the order id %s", key, orderID)
	}
}

// With the default exporter, none, nothing is recorded, yet the caller's
// trace context travels the same path unchanged: every no-op span hands on
// the context it was started from.
func TestWithoutAnExporterTheCallersTraceStillTravels(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	collector := testinfra.NewOTLPReceiver(t)
	p := startPlatform(t, "none", collector.URL)
	p.placeTracedOrder(ctx, t)
	ordersRow, orderHeader, billingRow, billingHeader := p.crossings(ctx, t)
	for what, got := range map[string]string{
		"the orders outbox row": ordersRow, "the orders.events message": orderHeader,
		"the billing outbox row": billingRow, "the billing.events message": billingHeader,
	} {
		if got != traceparent {
			t.Errorf("%s carries traceparent %q, want the caller's %q", what, got, traceparent)
		}
	}
	p.stop(t)
	if spans := collector.Spans(); len(spans) != 0 {
		t.Errorf("with the none exporter, %d spans were exported", len(spans))
	}
}

// platform is the four programs, running on topics and databases of their own.
type platform struct {
	brokers                           []string
	ordersTopic, billingTopic         string
	ordersDB, billingDB               string
	ordersURL, reconcilerURL          string
	orders, billing, shim, reconciler *harness.Proc
}

// startPlatform starts the four programs with OTEL_TRACES_EXPORTER set to
// exporter and OTEL_EXPORTER_OTLP_ENDPOINT to endpoint.
func startPlatform(t *testing.T, exporter, endpoint string) *platform {
	t.Helper()
	p := &platform{brokers: testinfra.KafkaBrokers(t)}
	p.ordersTopic = testinfra.NewTopic(t, p.brokers, 3)
	testinfra.NewTopicNamed(t, p.brokers, p.ordersTopic+".dlt", 1)
	p.billingTopic = testinfra.NewTopic(t, p.brokers, 3)
	testinfra.NewTopicNamed(t, p.brokers, p.billingTopic+".dlt", 1)
	// A leader named in the metadata may not serve its partition yet: a
	// consumer started then gets Not Leader For Partition (issue 11).
	readyCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkautil.WaitTopicsReady(readyCtx, p.brokers, p.ordersTopic, p.ordersTopic+".dlt", p.billingTopic, p.billingTopic+".dlt"); err != nil {
		t.Fatal(err)
	}
	p.ordersDB, p.billingDB = testinfra.NewDatabase(t), testinfra.NewDatabase(t)
	shimDB := testinfra.NewDatabase(t)
	// Each program runs as its database's runtime role and migrates as its
	// owner, as in production (package pgroles).
	ordersRoles := pgrolestest.Ensure(t, p.ordersDB, "orders")
	billingRoles := pgrolestest.Ensure(t, p.billingDB, "billing")
	shimRoles := pgrolestest.Ensure(t, shimDB, "shim")

	env := func(service string, kv ...string) map[string]string {
		env := map[string]string{
			"KAFKA_BROKERS":               strings.Join(p.brokers, ","),
			"LOG_LEVEL":                   "info",
			"SHUTDOWN_GRACE":              "5s",
			"OTEL_TRACES_EXPORTER":        exporter,
			"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
			"OTEL_SERVICE_NAME":           service,
		}
		for i := 0; i < len(kv); i += 2 {
			env[kv[i]] = kv[i+1]
		}
		return env
	}
	p.reconciler = harness.StartT(t, bins, harness.Reconciler, env("reconciler", "LEDGER_PATH", filepath.Join(t.TempDir(), "ledger.jsonl")))
	p.reconcilerURL = p.reconciler.URL()
	p.orders = harness.StartT(t, bins, harness.Orders, env("orders", "DATABASE_URL", ordersRoles.AppURL, "MIGRATE_DATABASE_URL", ordersRoles.OwnerURL, "ORDERS_TOPIC", p.ordersTopic))
	p.billing = harness.StartT(t, bins, harness.Billing, env("billing",
		"DATABASE_URL", billingRoles.AppURL, "MIGRATE_DATABASE_URL", billingRoles.OwnerURL, "ORDERS_TOPIC", p.ordersTopic, "BILLING_TOPIC", p.billingTopic,
		"CONSUMER_GROUP", testinfra.Name("billing")))
	p.shim = harness.StartT(t, bins, harness.Shim, env("reconciler-shim",
		"DATABASE_URL", shimRoles.AppURL, "MIGRATE_DATABASE_URL", shimRoles.OwnerURL, "BILLING_TOPIC", p.billingTopic, "CONSUMER_GROUP", testinfra.Name("shim"),
		"RECONCILER_URL", p.reconcilerURL, "RECONCILER_TIMEOUT", "5s"))
	p.ordersURL = p.orders.URL()
	return p
}

// placeTracedOrder places an order as a traced client would, waits until
// the third party booked its payment, checks that the booking is in the
// client's trace, and returns the order id.
func (p *platform) placeTracedOrder(ctx context.Context, t *testing.T) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.ordersURL+"/orders",
		strings.NewReader(`{"customerId":"c-trace","amountCents":4200,"currency":"EUR"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var order struct {
		ID string `json:"id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&order)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /orders: %d, %v", resp.StatusCode, err)
	}

	var booked []struct {
		OrderID string `json:"orderId"`
		TraceID string `json:"traceId"`
	}
	testinfra.WaitFor(t, 90*time.Second, "the reconciler to book the order's payment", func() (bool, error) {
		booked = nil
		if err := harness.GetJSON(ctx, p.reconcilerURL+"/settlements", &booked); err != nil {
			return false, err
		}
		return len(booked) > 0, nil
	})
	if len(booked) != 1 || booked[0].OrderID != order.ID || booked[0].TraceID != clientTraceID {
		t.Fatalf("the reconciler booked %+v, want one settlement of order %s in trace %s", booked, order.ID, clientTraceID)
	}
	return order.ID
}

// crossings returns the traceparents that crossed the process boundaries:
// the one stored in each outbox row and the one each Kafka message carried.
func (p *platform) crossings(ctx context.Context, t *testing.T) (ordersRow, orderHeader, billingRow, billingHeader string) {
	t.Helper()
	return storedTraceparent(t, p.ordersDB), kafkaTraceparent(ctx, t, p.brokers, p.ordersTopic),
		storedTraceparent(t, p.billingDB), kafkaTraceparent(ctx, t, p.brokers, p.billingTopic)
}

// stop stops the programs, which flushes the spans they still buffer.
func (p *platform) stop(t *testing.T) {
	t.Helper()
	for _, prog := range []*harness.Proc{p.orders, p.billing, p.shim, p.reconciler} {
		harness.StopT(t, prog)
	}
}

// bins are the four programs TestMain built, by name.
var bins map[string]string

// TestMain builds the four programs from this checkout once for all tests.
func TestMain(m *testing.M) { harness.TestMain(m, &bins) }

// storedTraceparent returns the traceparent of the one outbox row in db.
func storedTraceparent(t *testing.T, db string) string {
	t.Helper()
	return outboxtest.RequireEnqueued(t, testinfra.NewPool(t, db), outboxtest.Match{}).Traceparent
}

// kafkaTraceparent returns the traceparent header of the one message on topic.
func kafkaTraceparent(ctx context.Context, t *testing.T, brokers []string, topic string) string {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: testinfra.Name("check"), MaxWait: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m, err := r.FetchMessage(ctx)
	if err != nil {
		t.Fatalf("reading %s: %v", topic, err)
	}
	for _, h := range m.Headers {
		if h.Key == "traceparent" {
			return string(h.Value)
		}
	}
	return ""
}

func describe(spans map[string]testinfra.Span) string {
	var b bytes.Buffer
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s %-16s %-28q %v under %s\n", s.SpanID, s.Service, s.Name, s.Kind, s.ParentSpanID)
	}
	return b.String()
}
