package main

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/platform/testinfra"
)

// orders' readiness is its database's: with Kafka unreachable it stays ready
// and takes orders (the outbox holds them until Kafka is back), and with its
// database unreachable it is not ready, until the database is back.
func TestReadinessFollowsTheDatabaseNotKafka(t *testing.T) {
	db := testinfra.NewDatabase(t)
	pgProxy := testinfra.NewProxy(t, hostOf(t, db))
	kafkaDown := testinfra.ClosedAddr(t)
	svc := testinfra.Start(t, run, map[string]string{
		"HTTP_ADDR":     "127.0.0.1:0",
		"DATABASE_URL":  strings.Replace(db, hostOf(t, db), pgProxy.Addr(), 1),
		"KAFKA_BROKERS": kafkaDown,
		"ORDERS_TOPIC":  "orders.events",
	})
	addr := testinfra.Addr(t, svc.WaitRecord(t, 60*time.Second, "orders started"), "http_addr")
	ready := func() int {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}

	if got := ready(); got != http.StatusOK {
		t.Fatalf("/readyz = %d with Kafka unreachable, want 200: orders takes orders through a Kafka outage", got)
	}
	placeOrder(t, addr) // with Kafka unreachable

	pgProxy.Cut()
	testinfra.WaitFor(t, 20*time.Second, "/readyz to answer 503 with the database unreachable", func() (bool, error) {
		return ready() == http.StatusServiceUnavailable, nil
	})
	pgProxy.Heal()
	testinfra.WaitFor(t, 20*time.Second, "/readyz to answer 200 once the database is back", func() (bool, error) {
		return ready() == http.StatusOK, nil
	})
}

func hostOf(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
