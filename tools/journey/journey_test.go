package journey_test

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

	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/tools/journey"
)

// bins are the four programs TestMain built, by name.
var bins map[string]string

// TestMain builds the four programs from this checkout once: the journey is
// followed through the real services, not through rows a test wrote.
func TestMain(m *testing.M) { harness.TestMain(m, &bins) }

// TestJourneyOfACancelledOrderThroughTheRealPlatform places an order on the
// four real programs, cancels it once its payment is booked, and follows it
// with the read-only role: every hop is there, in order, with the Kafka
// coordinates, headers and relay mode; nothing is odd. Then the third party
// books the capture a second time (as a shim without its lease would), and
// the journey says so.
func TestJourneyOfACancelledOrderThroughTheRealPlatform(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	brokers := testinfra.KafkaBrokers(t)
	ordersTopic, billingTopic := testinfra.NewTopic(t, brokers, 3), testinfra.NewTopic(t, brokers, 3)
	testinfra.NewTopicNamed(t, brokers, ordersTopic+".dlt", 1)
	testinfra.NewTopicNamed(t, brokers, billingTopic+".dlt", 1)
	if err := kafkautil.WaitTopicsReady(ctx, brokers, ordersTopic, ordersTopic+".dlt", billingTopic, billingTopic+".dlt"); err != nil {
		t.Fatal(err)
	}
	ordersRoles := pgrolestest.Ensure(t, testinfra.NewDatabase(t), "orders", "ro")
	billingRoles := pgrolestest.Ensure(t, testinfra.NewDatabase(t), "billing", "ro")
	shimRoles := pgrolestest.Ensure(t, testinfra.NewDatabase(t), "shim", "ro")
	env := func(kv ...string) map[string]string {
		env := map[string]string{"KAFKA_BROKERS": strings.Join(brokers, ","), "SHUTDOWN_GRACE": "5s",
			"ORDERS_TOPIC": ordersTopic, "BILLING_TOPIC": billingTopic}
		for i := 0; i < len(kv); i += 2 {
			env[kv[i]] = kv[i+1]
		}
		return env
	}
	reconciler := harness.StartT(t, bins, harness.Reconciler, env("LEDGER_PATH", filepath.Join(t.TempDir(), "ledger.jsonl")))
	orders := harness.StartT(t, bins, harness.Orders, env("DATABASE_URL", ordersRoles.AppURL, "MIGRATE_DATABASE_URL", ordersRoles.OwnerURL))
	harness.StartT(t, bins, harness.Billing, env("DATABASE_URL", billingRoles.AppURL, "MIGRATE_DATABASE_URL", billingRoles.OwnerURL,
		"CONSUMER_GROUP", testinfra.Name("billing")))
	harness.StartT(t, bins, harness.Shim, env("DATABASE_URL", shimRoles.AppURL, "MIGRATE_DATABASE_URL", shimRoles.OwnerURL,
		"CONSUMER_GROUP", testinfra.Name("shim"), "RECONCILER_URL", reconciler.URL(), "RECONCILER_TIMEOUT", "5s"))

	var order struct {
		ID string `json:"id"`
	}
	post(t, orders.URL()+"/orders", `{"customerId":"c-journey","amountCents":4200,"currency":"EUR"}`, &order)
	booked := func(kind string) bool {
		var all []struct{ OrderID, Kind string }
		if err := harness.GetJSON(ctx, reconciler.URL()+"/settlements", &all); err != nil {
			return false
		}
		for _, s := range all {
			if s.OrderID == order.ID && s.Kind == kind {
				return true
			}
		}
		return false
	}
	testinfra.WaitFor(t, 90*time.Second, "the third party to book the capture", func() (bool, error) { return booked("capture"), nil })
	post(t, orders.URL()+"/orders/"+order.ID+"/cancel", `{}`, nil)
	testinfra.WaitFor(t, 90*time.Second, "the third party to book the refund", func() (bool, error) { return booked("refund"), nil })

	src := journey.Sources{
		Orders:  testinfra.NewPool(t, ordersRoles.ReaderURLs[0]),
		Billing: testinfra.NewPool(t, billingRoles.ReaderURLs[0]),
		Shim:    testinfra.NewPool(t, shimRoles.ReaderURLs[0]),
		Brokers: brokers, OrdersTopic: ordersTopic, BillingTopic: billingTopic, LedgerURL: reconciler.URL(),
	}
	var j journey.Journey
	// The shim records its forward right after the third party answers:
	// wait until the journey has settled rather than for a fixed time.
	testinfra.WaitFor(t, 30*time.Second, "a journey with nothing odd", func() (bool, error) {
		var err error
		j, err = journey.Follow(ctx, src, order.ID)
		return err == nil && len(j.Problems) == 0, err
	})
	var text bytes.Buffer
	if err := j.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("journey:\n%s", text.String())
	if j.Order == nil || j.Order.Status != "cancelled" {
		t.Fatalf("order = %+v, want the cancelled order", j.Order)
	}
	// Every hop of both events, in time order.
	want := []struct{ where, what string }{
		{"orders db", "order placed"},
		{"orders db", "outbox: OrderPlaced v1 written"},
		{"kafka " + ordersTopic, "OrderPlaced v1 at partition"},
		{"billing db", "inbox billing: OrderPlaced v1 received"},
		{"billing db", "charge captured"},
		{"billing db", "outbox: PaymentCaptured v1 written"},
		{"kafka " + billingTopic, "PaymentCaptured v1 at partition"},
		{"shim db", "PaymentCaptured v1 received"},
		{"ledger", "capture booked by the third party"},
		{"shim db", "capture forwarded to the third party"},
		{"orders db", "order cancelled"},
		{"kafka " + ordersTopic, "OrderCancelled v2 at partition"},
		{"billing db", "charge refunded"},
		{"ledger", "refund booked by the third party"},
	}
	next := 0
	for _, s := range j.Steps {
		if next < len(want) && s.Where == want[next].where && strings.Contains(s.What, want[next].what) {
			next++
		}
	}
	if next < len(want) {
		t.Fatalf("step %q in %s missing or out of order:\n%s", want[next].what, want[next].where, text.String())
	}
	for _, s := range j.Steps {
		if !strings.HasPrefix(s.Where, "kafka ") {
			continue
		}
		if s.Partition == nil || s.Offset == nil || s.Headers["event-id"] != s.EventID ||
			s.Headers["aggregate-id"] != order.ID || s.RelayMode != "poll" {
			t.Errorf("record step %+v: want its partition, offset, headers and the poll relay", s)
		}
		if !strings.HasPrefix(s.HopFrom, "outbox: ") || !strings.Contains(s.HopFrom, " written") || s.Hop > time.Minute {
			t.Errorf("record step %q: hop %v from %q, want the publish latency from its outbox row", s.What, s.Hop, s.HopFrom)
		}
	}
	var js bytes.Buffer
	if err := j.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back journey.Journey
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Steps) != len(j.Steps) || back.Problems == nil {
		t.Fatalf("JSON round trip: %v, %d steps, problems %v", err, len(back.Steps), back.Problems)
	}

	// The third party books the capture again under the same key: the
	// journey says so, with the key and what to run.
	var key string
	for _, s := range j.Steps {
		if s.Where == "ledger" && s.State == "capture" {
			key = s.EventID
		}
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, reconciler.URL()+"/settlements",
		strings.NewReader(fmt.Sprintf(`{"paymentId":%q,"orderId":%q,"kind":"capture","amountCents":4200,"currency":"EUR"}`, key, order.ID)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if j, err = journey.Follow(ctx, src, order.ID); err != nil {
		t.Fatal(err)
	}
	if len(j.Problems) != 1 || !strings.Contains(j.Problems[0], "booked idempotency key "+key+" 2 times") {
		t.Fatalf("problems after a second booking = %q, want the duplicate named", j.Problems)
	}
}

func post(t *testing.T, url, body string, out any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("POST %s: %s", url, resp.Status)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
}
