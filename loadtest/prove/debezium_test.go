package prove

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/contracts"
	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// TestDebeziumPublishesWithTheShippedConfiguration is the quick form of the
// Debezium proofs (`make prove RELAY_MODES=debezium`), run by `make test`
// against the dev stack: Kafka Connect with Debezium, started by
// devstack/connect.sh from docs/debezium/orders-outbox-connector.json as it
// is (its ${env:…} placeholders given this test's database, slot and
// topic), orders in RELAY_MODE=debezium as its runtime role, Debezium as the
// replication role and nothing more, billing consuming. Every order placed
// must be charged exactly once, each record must decode to the envelope
// with its trace context, on the partition the platform's own relays pick,
// as docs/asyncapi.yaml describes it (CloudEvents headers included),
// and orders must see Debezium stream from its slot.
//
// It needs java and the Connect and Debezium jars, which `make test` fetches
// (make debezium-jars); without them it fails saying so.
func TestDebeziumPublishesWithTheShippedConfiguration(t *testing.T) {
	t.Parallel()
	root := harness.Root(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := harness.CheckConnect(ctx, root); err != nil {
		t.Fatalf("%v\n(this test runs Kafka Connect with Debezium; `make test` fetches its jars first: make debezium-jars)", err)
	}
	brokers := testinfra.KafkaBrokers(t)
	const partitions = 3
	ordersTopic := testinfra.NewTopic(t, brokers, partitions)
	billingTopic := testinfra.NewTopic(t, brokers, partitions)
	for _, dlt := range []string{ordersTopic + ".dlt", billingTopic + ".dlt"} {
		testinfra.NewTopicNamed(t, brokers, dlt, 1)
	}
	if err := kafkautil.WaitTopicsReady(ctx, brokers, ordersTopic, billingTopic, ordersTopic+".dlt", billingTopic+".dlt"); err != nil {
		t.Fatal(err)
	}
	ordersDB, billingDB := testinfra.NewDatabase(t), testinfra.NewDatabase(t)
	roles := pgrolestest.Ensure(t, ordersDB, "orders")
	ordersPool, billingPool := testinfra.NewPool(t, ordersDB), testinfra.NewPool(t, billingDB)
	slot := testinfra.Name("debezium")
	t.Cleanup(func() { // after Connect stopped (registered before it), before the database goes
		testinfra.WaitFor(t, 30*time.Second, "Debezium's slot to be dropped", func() (bool, error) {
			_, err := ordersPool.Exec(context.Background(),
				`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
			return err == nil, nil
		})
	})

	bins, err := harness.Build(ctx, root, filepath.Join(t.TempDir(), "bin"), harness.Orders, harness.Billing)
	if err != nil {
		t.Fatal(err)
	}
	start := func(spec harness.Spec, env map[string]string) *harness.Proc {
		t.Helper()
		env["LOG_LEVEL"] = "info"
		p, err := harness.Start(ctx, harness.Config{Spec: spec, Bin: bins[spec.Name], Env: env,
			LogPath: filepath.Join(t.TempDir(), spec.Name+".log")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = p.Stop(20 * time.Second)
			if t.Failed() {
				t.Logf("--- last lines of %s's log ---\n%s", spec.Name, p.Tail(20))
			}
		})
		if err := p.WaitReady(ctx, "/readyz", 60*time.Second); err != nil {
			t.Fatal(err)
		}
		return p
	}
	orders := start(harness.Orders, map[string]string{
		"DATABASE_URL": roles.AppURL, "MIGRATE_DATABASE_URL": roles.OwnerURL, "KAFKA_BROKERS": strings.Join(brokers, ","),
		"ORDERS_TOPIC": ordersTopic, "RELAY_MODE": "debezium", "DEBEZIUM_SLOT": slot,
	})
	start(harness.Billing, map[string]string{
		"DATABASE_URL": billingDB, "KAFKA_BROKERS": strings.Join(brokers, ","), "ORDERS_TOPIC": ordersTopic,
		"BILLING_TOPIC": billingTopic, "CONSUMER_GROUP": testinfra.Name("billing"),
	})

	u, err := url.Parse(ordersDB)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	connect, err := harness.NewConnect(harness.ConnectConfig{Root: root, Dir: filepath.Join(t.TempDir(), "connect"),
		Brokers: brokers, DBHost: u.Hostname(), DBPort: port, DBName: strings.TrimPrefix(u.Path, "/"),
		DBUser: roles.Spec.Replication.Name, DBPassword: roles.Spec.Replication.Password,
		Slot: slot, Topic: ordersTopic, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- last lines of Kafka Connect's log ---\n%s", harness.Tail(connect.LogPath(), 30))
		}
		if err := connect.Down(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err := connect.Up(ctx); err != nil {
		t.Fatal(err)
	}
	// Events committed before the slot exists are not streamed
	// (snapshot.mode no_data): orders are placed once Debezium streams.
	testinfra.WaitFor(t, 60*time.Second, "Debezium to stream from its slot", func() (bool, error) {
		var active bool
		err := ordersPool.QueryRow(ctx, `SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)`, slot).Scan(&active)
		return err == nil && active, nil
	})

	const n = 5
	ids := map[string]bool{}
	for i := range n {
		ids[placeTraced(t, orders.URL(), fmt.Sprintf(`{"customerId":"c-%d","amountCents":%d,"currency":"EUR"}`, i, 100+i))] = true
	}
	testinfra.WaitFor(t, 60*time.Second, fmt.Sprintf("billing to charge the %d orders", n), func() (bool, error) {
		var charged int
		err := billingPool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&charged)
		return err == nil && charged >= n, nil
	})
	rows, err := billingPool.Query(ctx, `SELECT aggregate_id, count(*) FROM outbox_events WHERE event_type = 'PaymentCaptured' GROUP BY aggregate_id`)
	if err != nil {
		t.Fatal(err)
	}
	captured := map[string]int{}
	for rows.Next() {
		var id string
		var c int
		if err := rows.Scan(&id, &c); err != nil {
			t.Fatal(err)
		}
		captured[id] = c
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	for id := range ids {
		if captured[id] != 1 {
			t.Errorf("order %s was captured %d times, want once", id, captured[id])
		}
	}
	if len(captured) != n {
		t.Errorf("billing captured %d orders, want the %d placed", len(captured), n)
	}

	// The records as Debezium wrote them: our envelope and trace context, on
	// the partition our relays would pick for the key (murmur2, as Java).
	msgs := readRecords(t, ctx, brokers, ordersTopic, n)
	balancer := kafkautil.NewWriter(brokers, 1).KafkaWriter().Balancer
	all := make([]int, partitions)
	for i := range all {
		all[i] = i
	}
	// And as docs/asyncapi.yaml describes them, CloudEvents headers included,
	// read by the CloudEvents SDK (package contracts).
	spec, err := contracts.LoadAsyncAPI(filepath.Join(root, "docs", "asyncapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if _, err := spec.Channels["ordersEvents"].Check(m, partitions); err != nil {
			t.Errorf("Debezium's record is off the AsyncAPI contract: %v", err)
		}
		ev, err := event.FromKafka(m)
		if err != nil {
			t.Errorf("record at %d/%d does not decode: %v", m.Partition, m.Offset, err)
			continue
		}
		if !ids[ev.AggregateID] || ev.EventType != "OrderPlaced" || ev.CorrelationID == "" ||
			!strings.Contains(ev.Traceparent, testinfra.CallerTraceID) {
			t.Errorf("record of order %s: %s, correlation id %q, traceparent %q; want an OrderPlaced of a placed order "+
				"with a correlation id and the caller's trace", ev.AggregateID, ev.EventType, ev.CorrelationID, ev.Traceparent)
		}
		if want := balancer.Balance(kafka.Message{Key: m.Key}, all...); m.Partition != want {
			t.Errorf("order %s on partition %d; the platform's relays put it on %d", ev.AggregateID, m.Partition, want)
		}
	}

	// orders reads Debezium's slot: streaming, and no table backlog.
	testinfra.WaitFor(t, 20*time.Second, "orders to see Debezium stream from its slot", func() (bool, error) {
		resp, err := http.Get(orders.AdminURL() + "/metrics")
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		m, err := harness.SumMetrics(resp.Body, nil)
		return err == nil && m["outbox_external_publisher_streaming"] == 1 && m["outbox_pending_events"] == 0, nil
	})
}

// readRecords reads the first n records of topic, from every partition.
func readRecords(t *testing.T, ctx context.Context, brokers []string, topic string, n int) []kafka.Message {
	t.Helper()
	r := kafkautil.NewGroupReader(brokers, topic, testinfra.Name("reader"))
	defer r.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
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

// placeTraced places an order as a traced caller (a traceparent header) and
// returns its id.
func placeTraced(t *testing.T, base, body string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", testinfra.CallerTraceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var placed struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&placed); err != nil || resp.StatusCode != http.StatusCreated || placed.ID == "" {
		t.Fatalf("placing an order: status %d, id %q, %v", resp.StatusCode, placed.ID, err)
	}
	return placed.ID
}
