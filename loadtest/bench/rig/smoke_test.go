package rig_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/loadtest/bench/rig"
	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// TestK6Smoke runs loadtest/k6/smoke.js with the project's k6 against the
// real platform: four processes on free ports with databases and topics of
// their own. k6's thresholds must pass (exit 0), and the databases must
// agree with k6's audit: every order charged once and forwarded once.
func TestK6Smoke(t *testing.T) {
	root := harness.Root(t)
	k6 := filepath.Join(root, "bin", "k6")
	if _, err := os.Stat(k6); err != nil {
		t.Fatalf("this test runs the project's k6 build: run `make k6` first (`make test` does): %v", err)
	}
	brokers := testinfra.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	bin := t.TempDir()
	if err := rig.Build(ctx, root, bin); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	p, err := rig.Start(ctx, rig.Config{
		BinDir: bin, WorkDir: work, PostgresURL: testinfra.PostgresAdminURL(), Brokers: brokers,
		Name: testinfra.Name("k6smoke"), Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Destroy(context.Background()) })
	t.Cleanup(p.Stop) // runs first
	if err := p.Warm(ctx); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	r, err := rig.K6(ctx, k6, filepath.Join(root, "loadtest", "k6", "smoke.js"), p, &out)
	t.Logf("k6 output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("k6 exited %d; failed thresholds: %q (logs in %s)", r.ExitCode, r.ThresholdsFailed, work)
	}
	if r.OrdersPlaced < 50 || r.Settled != r.OrdersPlaced || r.Lost != 0 || r.Duplicated != 0 {
		t.Fatalf("report: %d placed, %d settled, %d lost, %d duplicated; want ≥ 50 placed, all settled once",
			int(r.OrdersPlaced), int(r.Settled), int(r.Lost), int(r.Duplicated))
	}
	if r.DuplicatesAbsorbed < 20 || r.PoisonDeadLettered < 4 {
		t.Fatalf("billing absorbed %v duplicates and dead-lettered %v poison messages; want 20 and 4",
			r.DuplicatesAbsorbed, r.PoisonDeadLettered)
	}

	// The databases, read here and not through the extension, agree: the
	// smoke's orders plus the warm-up order, each charged once, each
	// payment forwarded once.
	count := func(url, sql string) int {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	orders := count(p.OrdersDB, `SELECT count(*) FROM orders`)
	charges := count(p.BillingDB, `SELECT count(*) FROM charges`)
	forwarded := count(p.ShimDB, `SELECT count(DISTINCT order_id) FROM forwards WHERE kind = 'capture'`)
	captures := count(p.ShimDB, `SELECT count(*) FROM forwards WHERE kind = 'capture'`)
	if want := int(r.OrdersPlaced) + 1; orders != want || charges != want || forwarded != want || captures != want {
		t.Fatalf("orders %d, charges %d, orders forwarded %d, captures forwarded %d; want %d each",
			orders, charges, forwarded, captures, want)
	}
}

// TestDebugListenersAndCPUByPid checks what make bench measures with
// beside k6: every program's debug listener serves a CPU profile, and the
// CPU of the programs, the Postgres server and the Kafka broker is read by
// pid.
func TestDebugListenersAndCPUByPid(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	brokers := testinfra.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := t.TempDir()
	if err := rig.Build(ctx, root, bin); err != nil {
		t.Fatal(err)
	}
	p, err := rig.Start(ctx, rig.Config{
		BinDir: bin, WorkDir: t.TempDir(), PostgresURL: testinfra.PostgresAdminURL(), Brokers: brokers,
		Name: testinfra.Name("rigdebug"), Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Destroy(context.Background()) })
	t.Cleanup(p.Stop) // runs first

	srv := rig.FindServers(ctx, testinfra.PostgresAdminURL(), brokers)
	if len(srv.Missing) > 0 {
		t.Fatalf("servers not found: %v", srv.Missing)
	}
	for pid, comm := range map[int]string{srv.Postmaster: "postgres", srv.Kafka: "java"} {
		if s, err := rig.ReadProcStat(pid); err != nil || s.Comm != comm {
			t.Errorf("pid %d: %+v, %v; want a %s process", pid, s, err, comm)
		}
	}
	cpu := p.CPUGroups(srv, nil)
	// The reconciler may well have used less than a clock tick so far.
	for _, g := range []string{"orders", "billing", "shim", "reconciler", "postgres", "kafka"} {
		if _, ok := cpu[g]; !ok {
			t.Errorf("no CPU figure for %s", g)
		}
	}
	if cpu["postgres"] <= 0 || cpu["kafka"] <= 0 {
		t.Errorf("CPU of the servers: Postgres %v, Kafka %v; want some, they have been running", cpu["postgres"], cpu["kafka"])
	}

	dir := t.TempDir()
	for name := range p.PIDs() {
		if p.DebugURLs[name] == "" {
			t.Errorf("%s has no debug listener", name)
			continue
		}
		// The debug listener itself, without the token: Profile alone would
		// also succeed through PPROF on the operator listener.
		resp, err := http.Get(p.DebugURLs[name] + "/debug/pprof/cmdline")
		if err != nil {
			t.Errorf("%s's debug listener: %v", name, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s's debug listener: GET /debug/pprof/cmdline: %s", name, resp.Status)
		}
		path := filepath.Join(dir, name+".pprof")
		if err := p.Profile(ctx, name, time.Second, path); err != nil {
			t.Error(err)
			continue
		}
		// A CPU profile is gzipped protobuf.
		if b, err := os.ReadFile(path); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s's profile is not a gzipped pprof file (%d bytes, %v)", name, len(b), err)
		}
	}
	if len(p.PIDs()) != 4 {
		t.Errorf("pids of %d programs, want 4", len(p.PIDs()))
	}
}
