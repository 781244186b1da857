// Package testenv gives tests their own piece of real servers, the dev stack
// that `make up` starts by default: a fresh Postgres database, a fresh Kafka topic, and a way
// to wait for asynchronous results. A missing server fails the test with the
// command that starts it; nothing is ever skipped.
//
// The servers are found through ONCEFLOW_TEST_PG_URL (default
// postgres://postgres:postgres@127.0.0.1:7432/postgres?sslmode=disable) and
// ONCEFLOW_TEST_KAFKA_BROKERS (default 127.0.0.1:7092), so the libraries'
// tests and a team's own (through the kits, outboxtest and inboxtest) run
// against any Postgres and Kafka. It imports nothing of the platform, which
// builds its own test infrastructure (platform/testinfra) on it.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
)

const startHint = "start the dev stack with `make up` (from the repository root), or point the tests elsewhere"

// PostgresAdminURL is the URL of the server's maintenance database.
func PostgresAdminURL() string {
	if u := os.Getenv("ONCEFLOW_TEST_PG_URL"); u != "" {
		return u
	}
	return "postgres://postgres:postgres@127.0.0.1:7432/postgres?sslmode=disable"
}

// KafkaBrokers returns the test brokers after checking one answers.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	brokers := kafkaBrokers()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := Ping(ctx, brokers); err != nil {
		t.Fatalf("this test needs Apache Kafka: %v\n%s with ONCEFLOW_TEST_KAFKA_BROKERS", err, startHint)
	}
	return brokers
}

// kafkaBrokers reads ONCEFLOW_TEST_KAFKA_BROKERS, a comma-separated list.
func kafkaBrokers() []string {
	if b := os.Getenv("ONCEFLOW_TEST_KAFKA_BROKERS"); b != "" {
		return strings.Split(b, ",")
	}
	return []string{"127.0.0.1:7092"}
}

// Name returns a unique lower-case name with prefix, for databases and topics.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// NewDatabase creates an empty database for this test, drops it when the
// test ends, and returns its URL.
func NewDatabase(t testing.TB) string {
	t.Helper()
	admin := PostgresAdminURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("this test needs PostgreSQL: %v\n%s with ONCEFLOW_TEST_PG_URL", err, startHint)
	}
	defer conn.Close(ctx)
	name := Name("test")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating test database: %v", err)
	}
	dropOnCleanup(t, admin, name)
	return databaseURL(t, admin, name)
}

// dropOnCleanup drops the database name when the test ends.
func dropOnCleanup(t testing.TB, admin, name string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("dropping test database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping test database %s: %v", name, err)
		}
	})
}

// databaseURL is admin's URL with the database name in place of its own.
func databaseURL(t testing.TB, admin, name string) string {
	t.Helper()
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("parsing ONCEFLOW_TEST_PG_URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// NewPool opens a pool on url that closes when the test ends.
func NewPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// QueryColumn returns the values of query's one column (with args), in the
// rows' order, as T. It is never nil, so no rows equals an empty slice.
func QueryColumn[T any](t testing.TB, pool *pgxpool.Pool, query string, args ...any) []T {
	t.Helper()
	rows, err := pool.Query(context.Background(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		t.Fatal(err)
	}
	return append([]T{}, got...)
}

// NewTopic creates a topic with the given partitions for this test and
// deletes it when the test ends.
func NewTopic(t testing.TB, brokers []string, partitions int) string {
	t.Helper()
	name := Name("test")
	NewTopicNamed(t, brokers, name, partitions)
	return name
}

// NewTopicNamed creates the topic name for this test (replicated as
// TopicConfig says) and deletes it when the test ends; use it for names derived from another topic (a ".dlt"). configs
// are topic settings beside the broker's defaults (max.message.bytes for a
// test of oversized messages).
func NewTopicNamed(t testing.TB, brokers []string, name string, partitions int, configs ...kafka.ConfigEntry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctrl, err := Controller(ctx, brokers)
	if err != nil {
		t.Fatalf("creating topic: %v", err)
	}
	defer ctrl.Close()
	cfg, err := TopicConfig(ctrl, name, partitions, configs...)
	if err != nil {
		t.Fatalf("creating topic %s: %v", name, err)
	}
	if err := ctrl.CreateTopics(cfg); err != nil {
		t.Fatalf("creating topic %s: %v", name, err)
	}
	// A new topic's partitions get leaders asynchronously; wait until all have one.
	WaitFor(t, 20*time.Second, "topic "+name+" to have leaders", func() (bool, error) {
		parts, err := ctrl.ReadPartitions(name)
		if err != nil {
			return false, nil
		}
		for _, p := range parts {
			if p.Leader.Host == "" {
				return false, nil
			}
		}
		return len(parts) == partitions, nil
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctrl, err := Controller(ctx, brokers)
		if err != nil {
			t.Logf("deleting topic %s: %v", name, err)
			return
		}
		defer ctrl.Close()
		if err := ctrl.DeleteTopics(name); err != nil {
			t.Logf("deleting topic %s: %v", name, err)
		}
	})
}

// WaitFor polls cond until it returns true, fails the test on an error or
// when timeout passes, naming what it waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := 10 * time.Millisecond
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-time.After(tick)
		if tick < 200*time.Millisecond {
			tick *= 2
		}
	}
}

// HoldsFor checks cond throughout d, polling it, and fails the test the
// first time it is false or errs: the test of something that must not
// happen while a fault lasts (a position confirmed, a row deleted), which
// no event announces — so it is watched for a while, not slept through.
func HoldsFor(t testing.TB, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("checking that %s: %v", what, err)
		}
		if !ok {
			t.Fatalf("%s: no longer true after %v of %v", what, d-time.Until(end), d)
		}
		if time.Now().After(end) {
			return
		}
		<-time.After(10 * time.Millisecond)
	}
}

// Eventually polls cond every 20ms until it is true (it returns true) or
// timeout passes (false): WaitFor for examples, which have no testing.T.
func Eventually(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); ; <-time.After(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// MetricValue sums the samples of the counter or gauge called name in g
// (0 when absent), so tests can assert on what a component counted.
func MetricValue(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	return LabeledMetricValue(t, g, name, nil)
}

// LabeledMetricValue is MetricValue over only the samples of name whose
// labels include every pair in labels.
func LabeledMetricValue(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	samples:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue samples
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}
