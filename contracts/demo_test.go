package contracts_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/contracts"
	"github.com/onceflow/onceflow/platform/harness"
)

// programs are the four programs and the demo driver, built from this
// checkout once for the tests that need them (TestMain removes them).
var programs struct {
	once sync.Once
	dir  string
	bins map[string]string
	err  error
}

func buildPrograms(t *testing.T) map[string]string {
	t.Helper()
	programs.once.Do(func() {
		root, err := harness.RepoRoot()
		if err != nil {
			programs.err = err
			return
		}
		if programs.dir, programs.err = os.MkdirTemp("", "contracts-programs-"); programs.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		programs.bins, programs.err = harness.Build(ctx, root, programs.dir, harness.Orders, harness.Billing, harness.Shim, harness.Reconciler)
		if programs.err != nil {
			return
		}
		demo := filepath.Join(programs.dir, "demo")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", demo, "./tools/cmd/demo")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			programs.err = fmt.Errorf("building the demo driver: %v\n%s", err, out)
			return
		}
		programs.bins["demo"] = demo
	})
	if programs.err != nil {
		t.Fatal(programs.err)
	}
	return programs.bins
}

func TestMain(m *testing.M) {
	code := m.Run()
	if programs.dir != "" {
		os.RemoveAll(programs.dir)
	}
	os.Exit(code)
}

// TestDemoRecordsMatchTheAsyncAPI runs what `make demo` runs — the four
// programs (RELAY_MODE poll, the default) and the demo driver placing and
// cancelling orders until every payment is settled — on topics of its own,
// then checks every record they left, as `make contracts-check` does after
// a real `make demo`.
func TestDemoRecordsMatchTheAsyncAPI(t *testing.T) {
	t.Parallel()
	bins := buildPrograms(t)
	p := startPlatform(t, bins, "poll")
	token := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(token, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	demo := exec.CommandContext(ctx, bins["demo"], "-orders", "40", "-cancel", "0.2", "-concurrency", "4", "-timeout", "2m",
		"-orders-url", p.orders.URL(), "-billing-url", p.billing.URL(), "-shim-url", p.shim.URL(), "-reconciler-url", p.reconciler.URL(),
		"-orders-admin-url", p.orders.AdminURL(), "-billing-admin-url", p.billing.AdminURL(), "-shim-admin-url", p.shim.AdminURL(),
		"-admin-token-file", token)
	out, err := demo.CombinedOutput()
	if err != nil {
		t.Fatalf("the demo: %v\n%s", err, out)
	}
	t.Logf("the demo:\n%s", out)

	var report strings.Builder
	tally, err := loadAsyncAPI(t).CheckTopics(ctx, p.brokers[0], []contracts.Target{
		{Topic: p.ordersTopic, Channel: "ordersEvents"}, {Topic: p.ordersTopic + ".dlt", Channel: "ordersEventsDeadLetters"},
		{Topic: p.billingTopic, Channel: "billingEvents"}, {Topic: p.billingTopic + ".dlt", Channel: "billingEventsDeadLetters"},
	}, 5, &report)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("contract check of the demo's records:\n%s", report.String())
	// 40 orders (and their warm-up order) and their cancellations, a
	// capture per order and a refund per cancellation.
	if tally.Invalid > 0 || tally.Events < 2*41 {
		t.Errorf("%d records off the contract, %d valid events (want at least %d)", tally.Invalid, tally.Events, 2*41)
	}
}
