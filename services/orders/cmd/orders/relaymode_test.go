package main

import (
	"context"
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
			svc := testinfra.Start(t, run, map[string]string{
				"HTTP_ADDR":                "127.0.0.1:0",
				"ADMIN_ADDR":               "127.0.0.1:0",
				"DATABASE_URL":             roles.AppURL,
				"MIGRATE_DATABASE_URL":     roles.OwnerURL,
				"REPLICATION_DATABASE_URL": roles.ReplicationURL,
				"KAFKA_BROKERS":            strings.Join(brokers, ","),
				"ORDERS_TOPIC":             topic,
				"RELAY_MODE":               mode,
				"OUTBOX_SLOT":              slot,
			})
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
