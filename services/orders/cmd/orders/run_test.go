package main

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// With RELAY_ENABLED=false orders still takes orders and reports the backlog
// it is not publishing, so that the backlog alerts fire: the alerting drill
// relies on it.
func TestWithoutTheRelayOrdersAreTakenAndTheBacklogShows(t *testing.T) {
	brokers := testinfra.KafkaBrokers(t)
	db := testinfra.NewDatabase(t)
	// As its runtime role, migrated by its owner: the API needs no more.
	roles := pgrolestest.Ensure(t, db, "orders")
	svc := testinfra.Start(t, run, roles.ServiceEnv(brokers, map[string]string{
		"ORDERS_TOPIC":  testinfra.NewTopic(t, brokers, 1),
		"RELAY_ENABLED": "false",
	}))
	started := svc.WaitRecord(t, 60*time.Second, "orders started")
	addr, adminAddr := testinfra.Addr(t, started, "http_addr"), testinfra.Addr(t, started, "admin_addr")
	if _, ok := svc.Logs.Record("the outbox relay is disabled (RELAY_ENABLED=false): orders are taken but not published"); !ok {
		t.Fatalf("no warning that the relay is disabled:\n%s", svc.Logs.String())
	}
	placeOrder(t, addr)
	testinfra.WaitFor(t, 20*time.Second, "/metrics to show one pending event, one order and nothing published", func() (bool, error) {
		m := scrape(t, "http://"+adminAddr+"/metrics")
		return m["outbox_pending_events"] == "1" && m["orders_placed_total"] == "1" && m["outbox_published_total"] == "0" &&
			m["outbox_oldest_pending_age_seconds"] != "0", nil
	})
	outboxtest.RequireEnqueued(t, testinfra.NewPool(t, db), outboxtest.Match{State: "pending"})
}

// The operator routes and /metrics are on ADMIN_ADDR only, and the operator
// routes need the bearer token there.
func TestOperatorRoutesAreOnTheAdminListenerBehindTheToken(t *testing.T) {
	brokers := testinfra.KafkaBrokers(t)
	const token = "s3cret-operator-token"
	svc := testinfra.Start(t, run, map[string]string{
		"HTTP_ADDR":     "127.0.0.1:0",
		"ADMIN_ADDR":    "127.0.0.1:0",
		"ADMIN_TOKEN":   token,
		"PPROF":         "true",
		"DATABASE_URL":  testinfra.NewDatabase(t),
		"KAFKA_BROKERS": strings.Join(brokers, ","),
		"ORDERS_TOPIC":  testinfra.NewTopic(t, brokers, 1),
	})
	started := svc.WaitRecord(t, 60*time.Second, "orders started")
	addr, adminAddr := testinfra.Addr(t, started, "http_addr"), testinfra.Addr(t, started, "admin_addr")
	get := func(url, auth string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		name, url, auth string
		want            int
	}{
		{"public dead list", "http://" + addr + "/admin/outbox/dead", "Bearer " + token, 404},
		{"public metrics", "http://" + addr + "/metrics", "", 404},
		{"public pprof", "http://" + addr + "/debug/pprof/", "Bearer " + token, 404},
		{"public readyz", "http://" + addr + "/readyz", "", 200},
		{"admin without token", "http://" + adminAddr + "/admin/outbox/dead", "", 401},
		{"admin with a wrong token", "http://" + adminAddr + "/admin/outbox/dead", "Bearer " + token + "x", 401},
		{"admin with a prefix of the token", "http://" + adminAddr + "/admin/outbox/dead", "Bearer s3cret", 401},
		{"admin with the token", "http://" + adminAddr + "/admin/outbox/dead", "Bearer " + token, 200},
		{"pprof without token", "http://" + adminAddr + "/debug/pprof/", "", 401},
		{"pprof with the token", "http://" + adminAddr + "/debug/pprof/", "Bearer " + token, 200},
		{"admin metrics without token", "http://" + adminAddr + "/metrics", "", 200},
	} {
		if got := get(c.url, c.auth); got != c.want {
			t.Errorf("%s: GET %s = %d, want %d", c.name, c.url, got, c.want)
		}
	}
	if _, ok := svc.Logs.Record("operator call refused: missing or wrong bearer token"); !ok {
		t.Errorf("a refused operator call was not logged:\n%s", svc.Logs.String())
	}
}

// A listener other hosts reach must not serve the operator routes without
// a token: the service refuses to start, before touching the database.
func TestNonLoopbackAdminAddrWithoutTokenRefusesToStart(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:9081"} {
		env := map[string]string{"ADMIN_ADDR": addr, "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}
		err := run(t.Context(), nil, func(k string) string { return env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "ADMIN_TOKEN") {
			t.Errorf("ADMIN_ADDR=%s without ADMIN_TOKEN: run = %v, want a refusal naming ADMIN_TOKEN", addr, err)
		}
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
