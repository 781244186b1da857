package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestMinimalRuns builds the program as an adopter would and runs it against
// the real stack, in a database and on a topic of its own: the order it
// places must come out of the inbox, once.
func TestMinimalRuns(t *testing.T) {
	t.Parallel()
	admin := os.Getenv("ONCEFLOW_TEST_PG_URL")
	if admin == "" {
		admin = "postgres://postgres:postgres@127.0.0.1:7432/postgres?sslmode=disable"
	}
	brokers := os.Getenv("ONCEFLOW_TEST_KAFKA_BROKERS")
	if brokers == "" {
		brokers = "127.0.0.1:7092"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name := "minimal_" + hex.EncodeToString(suffix)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("this test needs PostgreSQL (start the dev stack with `make up`, or set ONCEFLOW_TEST_PG_URL): %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)") })
	dbURL, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	dbURL.Path = "/" + name

	bin := filepath.Join(t.TempDir(), "minimal")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL.String(), "KAFKA_BROKERS="+brokers, "TOPIC="+name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("minimal: %v\n%s\n(is the dev stack up? `make up`)", err, out)
	}
	t.Logf("minimal printed:\n%s", out)
	want := regexp.MustCompile(`(?m)^placed order (\S+) with its OrderPlaced event in one transaction\n` +
		`relayed to ` + name + ` and consumed through the inbox: 1 shipment for order (\S+)\n` +
		`outbox: OrderPlaced published\n` +
		`inbox minimal: OrderPlaced processed$`)
	// The libraries' log lines may come between the example's own: a topic
	// created a moment ago can refuse the first write (its leader not ready
	// yet), which the relay logs and retries, as it should.
	m := want.FindSubmatch(withoutLogLines(out))
	if m == nil || string(m[1]) != string(m[2]) {
		t.Fatalf("minimal printed\n%s\nwant the order placed, relayed and consumed once, and both rows' status", out)
	}

	// The operator's requeue: nothing was dead-lettered, so nothing goes back.
	cmd = exec.CommandContext(ctx, bin, "requeue")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL.String(), "KAFKA_BROKERS="+brokers, "TOPIC="+name)
	out, err = cmd.CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^requeued 0 dead letters to `+name+`$`).Match(out) {
		t.Fatalf("minimal requeue: %v\n%s", err, out)
	}
}

// withoutLogLines drops the slog lines (time=…) from a program's output.
func withoutLogLines(out []byte) []byte {
	var kept []string
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "time=") {
			kept = append(kept, line)
		}
	}
	return []byte(strings.Join(kept, "\n"))
}
