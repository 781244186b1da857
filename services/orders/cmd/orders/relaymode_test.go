package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// RELAY_MODE=cdc and wal publish an order's event through the log-based
// relay; wal leaves no outbox row behind, and the metrics show the slot.
// Under least privilege, as deployed: migrated by the owner, run as the app
// role, streaming as the replication role, which has nothing but
// REPLICATION and CONNECT (package pgroles).
func TestRelayModesPublishThroughTheReplicationSlot(t *testing.T) {
	for _, mode := range []string{"cdc", "wal"} {
		t.Run(mode, func(t *testing.T) {
			brokers := testinfra.KafkaBrokers(t)
			db := testinfra.NewDatabase(t)
			pool := testinfra.NewPool(t, db)
			roles := pgrolestest.Ensure(t, db, "orders")
			slot := testinfra.Name("orders_slot")
			t.Cleanup(func() { // before the database is dropped, after the service stopped
				testinfra.WaitFor(t, 20*time.Second, "the slot to be dropped", func() (bool, error) {
					_, err := pool.Exec(context.Background(),
						`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
					return err == nil, nil
				})
			})
			topic := testinfra.NewTopic(t, brokers, 1)
			svc := testinfra.Start(t, run, roles.ServiceEnv(brokers, map[string]string{
				"REPLICATION_DATABASE_URL": roles.ReplicationURL,
				"ORDERS_TOPIC":             topic,
				"RELAY_MODE":               mode,
				"OUTBOX_SLOT":              slot,
			}))
			started := svc.WaitRecord(t, 60*time.Second, "orders started")
			svc.WaitRecord(t, 60*time.Second, "streaming the outbox from the replication slot")
			addr, adminAddr := testinfra.Addr(t, started, "http_addr"), testinfra.Addr(t, started, "admin_addr")
			placeOrder(t, addr)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r := kafkautil.NewGroupReader(brokers, topic, testinfra.Name("g"))
			defer r.Close()
			m, err := r.FetchMessage(ctx)
			if err != nil {
				t.Fatalf("reading the order's event: %v\n%s", err, svc.Logs.String())
			}
			ev, err := event.FromKafka(kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers})
			if err != nil || ev.EventType != "OrderPlaced" {
				t.Fatalf("event %+v, %v; want OrderPlaced", ev, err)
			}
			if mode == "wal" {
				outboxtest.RequireNotEnqueued(t, pool, outboxtest.Match{})
			}
			testinfra.WaitFor(t, 20*time.Second, "/metrics to show the active slot", func() (bool, error) {
				got := scrape(t, "http://"+adminAddr+"/metrics")
				return got["outbox_slot_active"] == "1" && got["outbox_published_total"] == "1", nil
			})
		})
	}
}

// RELAY_MODE=debezium runs no relay: Debezium publishes from a slot of its
// own. The rows stay pending without showing as a backlog (the table cannot
// tell what Debezium published); the slot's gauges are the backlog, and an
// operator action the mode cannot carry out is refused with 409.
func TestDebeziumModeRunsNoRelayAndReadsTheConnectorsSlot(t *testing.T) {
	brokers := testinfra.KafkaBrokers(t)
	db := testinfra.NewDatabase(t)
	pool := testinfra.NewPool(t, db)
	roles := pgrolestest.Ensure(t, db, "orders")
	slot := testinfra.Name("debezium_slot")
	t.Cleanup(func() {
		testinfra.WaitFor(t, 20*time.Second, "the slot to be dropped", func() (bool, error) {
			_, err := pool.Exec(context.Background(),
				`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
			return err == nil, nil
		})
	})
	const token = "debezium-mode-token"
	svc := testinfra.Start(t, run, roles.ServiceEnv(brokers, map[string]string{
		"ADMIN_TOKEN":      token,
		"ORDERS_TOPIC":     testinfra.NewTopic(t, brokers, 1),
		"RELAY_MODE":       "debezium",
		"DEBEZIUM_SLOT":    slot,
		"OUTBOX_RETENTION": "72h",
		"LOG_LEVEL":        "debug", // the pruner's first run, which finds nothing, logs at debug
	}))
	started := svc.WaitRecord(t, 60*time.Second, "orders started")
	addr, adminAddr := testinfra.Addr(t, started, "http_addr"), testinfra.Addr(t, started, "admin_addr")
	svc.WaitRecord(t, 10*time.Second, "RELAY_MODE=debezium: no relay runs here; Debezium publishes the outbox from its own slot, which the backlog gauges read")
	pruned := svc.WaitRecord(t, 10*time.Second, "outbox prune found nothing to remove")
	if pruned["pending_retention"] != float64(72*time.Hour) {
		t.Errorf("the pruner's pending retention is %v, want OUTBOX_RETENTION (72h)", pruned["pending_retention"])
	}

	placeOrder(t, addr)
	metrics := func() map[string]string { return scrape(t, "http://"+adminAddr+"/metrics") }
	testinfra.WaitFor(t, 20*time.Second, "/metrics to show the order, no backlog and no publisher on the missing slot", func() (bool, error) {
		m := metrics()
		return m["orders_placed_total"] == "1" && m["outbox_external_publisher_streaming"] == "0", nil
	})
	if m := metrics(); m["outbox_pending_events"] != "0" || m["outbox_oldest_pending_age_seconds"] != "0" || m["outbox_published_total"] != "0" {
		t.Errorf("pending %s, oldest age %s, published %s: want 0, 0, 0 (no relay here, and pending rows are no backlog in this mode)",
			m["outbox_pending_events"], m["outbox_oldest_pending_age_seconds"], m["outbox_published_total"])
	}
	outboxtest.RequireEnqueued(t, pool, outboxtest.Match{State: "pending"})

	// The connector's slot, created as Debezium creates it; nobody streams.
	if _, err := pool.Exec(context.Background(), `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	placeOrder(t, addr)
	testinfra.WaitFor(t, 20*time.Second, "/metrics to show the slot's lag", func() (bool, error) {
		m := metrics()
		return m["outbox_slot_lag_bytes"] != "0" && m["outbox_slot_retained_wal_bytes"] != "0" && m["outbox_external_publisher_streaming"] == "0", nil
	})

	req, _ := http.NewRequest(http.MethodPost, "http://"+adminAddr+"/admin/outbox/requeue", strings.NewReader(`{"all":true}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "RELAY_MODE=debezium keeps no dead events") {
		t.Errorf("requeue of every dead event = %d %s; want 409 saying Debezium keeps no dead events", resp.StatusCode, body)
	}
}
