package contracts_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/contracts"
	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/testinfra"
)

const (
	partitions = 3
	adminToken = "contracts-test-token"
)

// TestRealServicesMatchTheContracts runs the four programs, built from
// this checkout, in each relay mode (orders and billing both in it), and
// holds what they do to the documents:
//   - every record on orders' and billing's topics validates against
//     docs/asyncapi.yaml (headers, payload, key = aggregate id, partition =
//     murmur2) and reads as a valid CloudEvent through the CloudEvents SDK;
//   - records off the contract (a payload without amountCents, one with a
//     string where an integer belongs, a header that does not parse) are
//     refused by the document and dead-lettered by billing's inbox with the
//     reason; the dead letters validate as the DeadLetter message;
//   - every HTTP response the test provokes, on the public and the
//     operator listener, validates against docs/openapi-*.yaml.
func TestRealServicesMatchTheContracts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bins := buildPrograms(t)
	spec := loadAsyncAPI(t)
	public, err := contracts.LoadOpenAPI("../docs/openapi-orders.yaml")
	if err != nil {
		t.Fatal(err)
	}
	operator, err := contracts.LoadOpenAPI("../docs/openapi-operator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"poll", "cdc", "wal"} {
		t.Run(mode, func(t *testing.T) {
			p := startPlatform(t, bins, mode)
			hc := &httpChecker{t: t, public: public, operator: operator}
			placed := hc.exercise(ctx, p)
			poison := p.producePoison(ctx, t, spec)

			// orders: the orders placed and one cancellation; billing: a
			// capture per order and a refund.
			ordersRecords := readAll(ctx, t, p.brokers, p.ordersTopic, len(placed)+1+len(poison))
			billingRecords := readAll(ctx, t, p.brokers, p.billingTopic, len(placed)+1)
			for _, c := range []struct {
				channel string
				records []kafka.Message
			}{{"ordersEvents", ordersRecords}, {"billingEvents", billingRecords}} {
				seen := map[string]int{}
				for _, m := range c.records {
					if _, isPoison := poison[string(m.Key)]; isPoison {
						continue
					}
					id, err := spec.Channels[c.channel].Check(m, partitions)
					if err != nil {
						t.Errorf("RELAY_MODE=%s: %v", mode, err)
					}
					seen[id]++
				}
				t.Logf("RELAY_MODE=%s %s: %v, each valid against the document and read by the CloudEvents SDK", mode, c.channel, seen)
			}

			// Each poison record is dead-lettered by billing with its reason.
			dlt := readAll(ctx, t, p.brokers, p.ordersTopic+".dlt", len(poison))
			for _, m := range dlt {
				if _, err := spec.Channels["ordersEventsDeadLetters"].Check(m, 0); err != nil {
					t.Errorf("dead letter: %v", err)
				}
				h, _ := contracts.HeaderObject(m.Headers)
				what, ok := poison[string(m.Key)]
				if !ok {
					t.Errorf("a dead letter of key %q, which is no poison record: %v", m.Key, h["dlt-reason"])
					continue
				}
				t.Logf("RELAY_MODE=%s: %s\n  AsyncAPI: %s\n  billing's inbox dead-lettered it, dlt-reason: %s", mode, what.name, what.schemaErr, h["dlt-reason"])
				delete(poison, string(m.Key))
			}
			for _, what := range poison {
				t.Errorf("poison record %q was not dead-lettered", what.name)
			}
			hc.operatorCalls(ctx, p, mode)
		})
	}
}

// platform is the four programs of one relay mode.
type platform struct {
	brokers                           []string
	ordersTopic, billingTopic         string
	orders, billing, shim, reconciler *harness.Proc
}

func startPlatform(t *testing.T, bins map[string]string, mode string) *platform {
	t.Helper()
	p := &platform{brokers: testinfra.KafkaBrokers(t)}
	p.ordersTopic = testinfra.NewTopic(t, p.brokers, partitions)
	p.billingTopic = testinfra.NewTopic(t, p.brokers, partitions)
	testinfra.NewTopicNamed(t, p.brokers, p.ordersTopic+".dlt", 1)
	testinfra.NewTopicNamed(t, p.brokers, p.billingTopic+".dlt", 1)
	readyCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkautil.WaitTopicsReady(readyCtx, p.brokers, p.ordersTopic, p.billingTopic, p.ordersTopic+".dlt", p.billingTopic+".dlt"); err != nil {
		t.Fatal(err)
	}
	common := map[string]string{"KAFKA_BROKERS": strings.Join(p.brokers, ","), "LOG_LEVEL": "info",
		"SHUTDOWN_GRACE": "5s", "ADMIN_TOKEN": adminToken}
	env := func(kv ...string) map[string]string {
		e := map[string]string{}
		for k, v := range common {
			e[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			e[kv[i]] = kv[i+1]
		}
		return e
	}
	// A service's database, as its roles; in the log-based modes also its
	// walsender login and a slot, dropped after the service stopped.
	db := func(service string) []string {
		url := testinfra.NewDatabase(t)
		roles := pgrolestest.Ensure(t, url, service)
		kv := []string{"DATABASE_URL", roles.AppURL, "MIGRATE_DATABASE_URL", roles.OwnerURL, "RELAY_MODE", mode}
		if mode == "cdc" || mode == "wal" {
			slot := testinfra.Name(service + "_slot")
			pool := testinfra.NewPool(t, url)
			t.Cleanup(func() {
				testinfra.WaitFor(t, 20*time.Second, "the slot to be dropped", func() (bool, error) {
					_, err := pool.Exec(context.Background(),
						`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
					return err == nil, nil
				})
			})
			kv = append(kv, "REPLICATION_DATABASE_URL", roles.ReplicationURL, "OUTBOX_SLOT", slot)
		}
		return kv
	}
	p.reconciler = harness.StartT(t, bins, harness.Reconciler, env("LEDGER_PATH", filepath.Join(t.TempDir(), "ledger.jsonl")))
	p.orders = harness.StartT(t, bins, harness.Orders, env(append(db("orders"), "ORDERS_TOPIC", p.ordersTopic)...))
	p.billing = harness.StartT(t, bins, harness.Billing, env(append(db("billing"), "ORDERS_TOPIC", p.ordersTopic,
		"BILLING_TOPIC", p.billingTopic, "CONSUMER_GROUP", testinfra.Name("billing"))...))
	shimDB := testinfra.NewDatabase(t)
	shimRoles := pgrolestest.Ensure(t, shimDB, "shim")
	p.shim = harness.StartT(t, bins, harness.Shim, env("DATABASE_URL", shimRoles.AppURL, "MIGRATE_DATABASE_URL", shimRoles.OwnerURL,
		"BILLING_TOPIC", p.billingTopic, "CONSUMER_GROUP", testinfra.Name("shim"), "RECONCILER_URL", p.reconciler.URL()))
	for _, prog := range []*harness.Proc{p.orders, p.billing, p.shim, p.reconciler} {
		if err := prog.WaitReady(context.Background(), "/readyz", 60*time.Second); err != nil {
			t.Fatalf("%s: %v\n%s", prog.Name(), err, prog.Tail(20))
		}
	}
	return p
}

// poisonRecord is a record off the contract, and what the document says
// of it.
type poisonRecord struct{ name, schemaErr string }

// producePoison writes records that break the contract to orders' topic,
// each on an aggregate of its own, checks that the document refuses each,
// and returns them by key.
func (p *platform) producePoison(ctx context.Context, t *testing.T, spec *contracts.AsyncAPI) map[string]poisonRecord {
	t.Helper()
	out := map[string]poisonRecord{}
	var msgs []kafka.Message
	for _, c := range []struct {
		name string
		edit func(m *kafkaMessage)
	}{
		{"an OrderPlaced without amountCents", func(m *kafkaMessage) {
			m.Value = []byte(fmt.Sprintf(`{"orderId":%q,"customerId":"c-1","currency":"EUR","placedAt":"2026-06-08T09:14:32Z"}`, m.Key))
		}},
		{"an OrderPlaced whose amountCents is a string", func(m *kafkaMessage) {
			m.Value = []byte(fmt.Sprintf(`{"orderId":%q,"customerId":"c-1","amountCents":"1999","currency":"EUR","placedAt":"2026-06-08T09:14:32Z"}`, m.Key))
		}},
		{"an OrderPlaced whose event-version header is not a number", func(m *kafkaMessage) { m.setHeader(event.HeaderEventVersion, "one") }},
	} {
		e := goEvents()[0]
		ev := envelopeOf(t, e)
		m := kafkaMessage{event.ToKafka(p.ordersTopic, ev)}
		c.edit(&m)
		_, err := spec.Channels["ordersEvents"].Check(m.Message, 0)
		if err == nil {
			t.Fatalf("%s: the document accepts it", c.name)
		}
		out[string(m.Key)] = poisonRecord{c.name, lastLines(err.Error(), 2)}
		msgs = append(msgs, m.Message)
	}
	w := kafkautil.NewWriter(p.brokers, 10)
	defer w.Close()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	return strings.Join(lines, " ")
}

// readAll reads n records of topic from its start, waiting up to a minute.
func readAll(ctx context.Context, t *testing.T, brokers []string, topic string, n int) []kafka.Message {
	t.Helper()
	r := kafkautil.NewGroupReader(brokers, topic, testinfra.Name("contracts"))
	defer r.Close()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var out []kafka.Message
	for len(out) < n {
		m, err := r.FetchMessage(rctx)
		if err != nil {
			t.Fatalf("read %d of %d records of %s: %v", len(out), n, topic, err)
		}
		out = append(out, m)
	}
	return out
}

// httpChecker makes HTTP calls and checks each response against the
// document of its listener.
type httpChecker struct {
	t                *testing.T
	public, operator *contracts.OpenAPI
}

// call sends method url (the base of the listener, then path) with body
// and headers, checks the response against doc's operation op (the path
// template) and status want, and returns the body.
func (h *httpChecker) call(ctx context.Context, doc *contracts.OpenAPI, method, base, path, op, body string, want int, headers ...string) []byte {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		h.t.Errorf("%s %s: %d %s, want %d", method, path, resp.StatusCode, got, want)
		return got
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := doc.CheckResponse(method, op, resp.StatusCode, got); err != nil {
			h.t.Errorf("%v", err)
		}
	} else if err := doc.CheckResponse(method, op, resp.StatusCode, nil); err != nil && !strings.Contains(err.Error(), "not JSON") &&
		!strings.Contains(err.Error(), "no application/json schema") {
		h.t.Errorf("%v", err)
	}
	return got
}

// exercise calls every operation of orders' public API, the successes and
// the errors, and returns the ids of the orders it placed (the first one
// cancelled).
func (h *httpChecker) exercise(ctx context.Context, p *platform) []string {
	h.t.Helper()
	base := p.orders.URL()
	var ids []string
	place := func(body string, want int, headers ...string) string {
		var o struct{ ID string }
		got := h.call(ctx, h.public, "POST", base, "/orders", "/orders", body, want, headers...)
		_ = json.Unmarshal(got, &o)
		return o.ID
	}
	key := uuid.NewString()
	ids = append(ids, place(`{"customerId":"c-1","amountCents":1999,"currency":"EUR"}`, 201, "Idempotency-Key", key, "traceparent", testinfra.CallerTraceparent))
	if again := place(`{"customerId":"c-1","amountCents":1999,"currency":"EUR"}`, 200, "Idempotency-Key", key); again != ids[0] {
		h.t.Errorf("the idempotent replay returned order %s, want %s", again, ids[0])
	}
	ids = append(ids, place(`{"customerId":"c-2","amountCents":250,"currency":"JPY"}`, 201))
	ids = append(ids, place(`{"customerId":"c-3","amountCents":100000,"currency":"USD"}`, 201))
	place(`{"customerId":"c-1","amountCents":2000,"currency":"EUR"}`, 409, "Idempotency-Key", key)
	place(`{"customerId":"c-1","amountCents":-5,"currency":"EUR"}`, 422)
	place(`{"customerId":"c-1","amountCents":5,"currency":"EUR","extra":1}`, 400)
	h.call(ctx, h.public, "POST", base, "/orders", "/orders", "", 415, "Content-Type", "text/plain")
	h.call(ctx, h.public, "GET", base, "/orders/"+ids[1], "/orders/{id}", "", 200)
	h.call(ctx, h.public, "GET", base, "/orders/"+uuid.NewString(), "/orders/{id}", "", 404)
	h.call(ctx, h.public, "GET", base, "/orders/not-a-uuid", "/orders/{id}", "", 400)
	h.call(ctx, h.public, "POST", base, "/orders/"+ids[0]+"/cancel", "/orders/{id}/cancel", "", 200)
	h.call(ctx, h.public, "POST", base, "/orders/"+uuid.NewString()+"/cancel", "/orders/{id}/cancel", "", 404)
	h.call(ctx, h.public, "GET", base, "/healthz", "/healthz", "", 200)
	h.call(ctx, h.public, "GET", base, "/readyz", "/readyz", "", 200)
	return ids
}

// operatorCalls calls the operator endpoints of each program that serves
// them, with and without the token.
func (h *httpChecker) operatorCalls(ctx context.Context, p *platform, mode string) {
	h.t.Helper()
	auth := []string{"Authorization", "Bearer " + adminToken}
	for _, prog := range []*harness.Proc{p.orders, p.billing, p.shim, p.reconciler} {
		h.call(ctx, h.operator, "GET", prog.AdminURL(), "/healthz", "/healthz", "", 200)
		h.call(ctx, h.operator, "GET", prog.AdminURL(), "/metrics", "/metrics", "", 200)
	}
	for _, prog := range []*harness.Proc{p.orders, p.billing} {
		a := prog.AdminURL()
		h.call(ctx, h.operator, "GET", a, "/admin/outbox/dead", "/admin/outbox/dead", "", 401)
		h.call(ctx, h.operator, "GET", a, "/admin/outbox/dead?limit=10", "/admin/outbox/dead", "", 200, auth...)
		h.call(ctx, h.operator, "GET", a, "/admin/outbox/dead?limit=0", "/admin/outbox/dead", "", 400, auth...)
		requeue := 200
		if mode == "wal" {
			requeue = 409 // the WAL keeps no dead rows
		}
		h.call(ctx, h.operator, "POST", a, "/admin/outbox/requeue", "/admin/outbox/requeue", `{"all":true}`, requeue, auth...)
		h.call(ctx, h.operator, "POST", a, "/admin/outbox/requeue", "/admin/outbox/requeue", `{}`, 400, auth...)
		window := fmt.Sprintf(`{"aggregateType":"order","from":%q,"to":%q}`,
			time.Now().Add(-time.Hour).UTC().Format(time.RFC3339), time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		replay := 200
		if mode == "wal" {
			replay = 409 // no copy to replay from
		}
		h.call(ctx, h.operator, "POST", a, "/admin/outbox/replay", "/admin/outbox/replay", window, replay, auth...)
	}
	for _, c := range []struct {
		prog  *harness.Proc
		topic string
	}{{p.billing, p.ordersTopic}, {p.shim, p.billingTopic}} {
		a := c.prog.AdminURL()
		h.call(ctx, h.operator, "GET", a, "/admin/inbox/dead-letters?topic="+c.topic, "/admin/inbox/dead-letters", "", 200, auth...)
		h.call(ctx, h.operator, "GET", a, "/admin/inbox/dead-letters?topic=nope", "/admin/inbox/dead-letters", "", 404, auth...)
		h.call(ctx, h.operator, "GET", a, "/admin/inbox/parked", "/admin/inbox/parked", "", 200, auth...)
		h.call(ctx, h.operator, "POST", a, "/admin/inbox/dead-letters/requeue", "/admin/inbox/dead-letters/requeue", `{}`, 400, auth...)
		h.call(ctx, h.operator, "POST", a, "/admin/inbox/dead-letters/requeue", "/admin/inbox/dead-letters/requeue",
			fmt.Sprintf(`{"topic":%q,"eventIds":[%q]}`, c.topic, uuid.NewString()), 404, auth...)
		h.call(ctx, h.operator, "POST", a, "/admin/inbox/dead-letters/requeue", "/admin/inbox/dead-letters/requeue",
			fmt.Sprintf(`{"topic":%q,"all":true,"consumer":"nobody"}`, c.topic), 200, auth...)
	}
	r := p.reconciler.AdminURL()
	h.call(ctx, h.operator, "GET", r, "/admin/faults", "/admin/faults", "", 401)
	h.call(ctx, h.operator, "GET", r, "/admin/faults", "/admin/faults", "", 200, auth...)
	h.call(ctx, h.operator, "POST", r, "/admin/faults", "/admin/faults", `{"failNext":0}`, 200, auth...)
}
