package main

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/pkg/platform/testinfra"
)

// With RELAY_ENABLED=false orders still takes orders and reports the backlog
// it is not publishing, so that the backlog alerts fire: the alerting drill
// relies on it.
func TestWithoutTheRelayOrdersAreTakenAndTheBacklogShows(t *testing.T) {
	brokers := testinfra.KafkaBrokers(t)
	db := testinfra.NewDatabase(t)
	// As its runtime role, migrated by its owner: the API needs no more.
	roles := pgrolestest.Ensure(t, db, "orders")
	svc := testinfra.Start(t, run, map[string]string{
		"HTTP_ADDR":            "127.0.0.1:0",
		"DATABASE_URL":         roles.AppURL,
		"MIGRATE_DATABASE_URL": roles.OwnerURL,
		"KAFKA_BROKERS":        strings.Join(brokers, ","),
		"ORDERS_TOPIC":         testinfra.NewTopic(t, brokers, 1),
		"RELAY_ENABLED":        "false",
	})
	var addr string
	testinfra.WaitFor(t, 60*time.Second, "orders to start", func() (bool, error) {
		rec, ok := svc.Logs.Record("orders started")
		if ok {
			addr, _ = rec["http_addr"].(string)
		}
		return ok, nil
	})
	if _, ok := svc.Logs.Record("the outbox relay is disabled (RELAY_ENABLED=false): orders are taken but not published"); !ok {
		t.Fatalf("no warning that the relay is disabled:\n%s", svc.Logs.String())
	}
	resp, err := http.Post("http://"+addr+"/orders", "application/json",
		strings.NewReader(`{"customerId":"c1","amountCents":100,"currency":"EUR"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("placing an order: status %d", resp.StatusCode)
	}
	testinfra.WaitFor(t, 20*time.Second, "/metrics to show one pending event, one order and nothing published", func() (bool, error) {
		m := scrape(t, "http://"+addr+"/metrics")
		return m["outbox_pending_events"] == "1" && m["orders_placed_total"] == "1" && m["outbox_published_total"] == "0" &&
			m["outbox_oldest_pending_age_seconds"] != "0", nil
	})
	pool := testinfra.NewPool(t, db)
	var pending int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_events WHERE state = 'pending'`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if pending != 1 {
		t.Fatalf("%d pending outbox rows, want 1", pending)
	}
}

// scrape returns the unlabelled samples of a /metrics page.
func scrape(t *testing.T, url string) map[string]string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if name, value, ok := strings.Cut(sc.Text(), " "); ok && !strings.HasPrefix(name, "#") && !strings.Contains(name, "{") {
			out[name] = value
		}
	}
	return out
}
