package main

import (
	"bytes"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// startRun runs the command with env until the test ends, and returns its
// start record and a function that stops it and returns run's error.
func startRun(t *testing.T, env map[string]string) (map[string]any, func() error) {
	t.Helper()
	r := testinfra.Start(t, run, env)
	return r.WaitRecord(t, 10*time.Second, "reconciler listening"), r.Stop
}

func TestRunServesAndStopsOnCancel(t *testing.T) {
	env := map[string]string{
		"HTTP_ADDR":   "127.0.0.1:0",
		"ADMIN_ADDR":  "127.0.0.1:0",
		"ADMIN_TOKEN": "test-token",
		"LEDGER_PATH": filepath.Join(t.TempDir(), "ledger.jsonl"),
		"LOG_LEVEL":   "debug",
	}
	start, stop := startRun(t, env)
	if start["service"] != "reconciler" || start["ledger_path"] != env["LEDGER_PATH"] {
		t.Fatalf("start line = %v, want service reconciler and the ledger path", start)
	}
	base := "http://" + start["addr"].(string)

	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz = %d", resp.StatusCode)
	}

	c := thirdparty.NewClient(base, nil)
	req := thirdparty.SettleRequest{PaymentID: "p1", OrderID: "o1", Kind: thirdparty.KindCapture, AmountCents: 999, Currency: "USD"}
	s, err := c.Settle(t.Context(), "p1:capture", req)
	if err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if s.ID == "" || s.PaymentID != "p1" {
		t.Fatalf("Settle returned %+v", s)
	}
	if found, err := c.Lookup(t.Context(), "p1:capture"); err != nil || !found {
		t.Fatalf("Lookup = %v, %v; want true", found, err)
	}

	admin := "http://" + start["admin_addr"].(string)
	for path, want := range map[string]int{base + "/metrics": 404, base + "/admin/faults": 404, admin + "/admin/faults": 401} {
		resp, err := http.Get(path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s = %d, want %d", path, resp.StatusCode, want)
		}
	}
	if err := c.WithAdmin(admin, "test-token").SetFaults(t.Context(), thirdparty.Faults{}); err != nil {
		t.Fatalf("SetFaults with the token: %v", err)
	}
	resp, err = http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `reconciler_settlements_total{kind="capture"} 1`) {
		t.Fatalf("/metrics lacks the settlement count:\n%s", metrics)
	}

	if err := stop(); err != nil {
		t.Fatalf("run after cancel = %v, want nil", err)
	}

	// The ledger outlives the process: a restart starts from what was booked.
	start, stop = startRun(t, env)
	if start["settlements"] != float64(1) {
		t.Fatalf("restart start line = %v, want settlements 1", start)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	env := map[string]string{"LOG_LEVEL": "loud", "LEDGER_PATH": filepath.Join(t.TempDir(), "l.jsonl")}
	err := run(t.Context(), []string{"reconciler"}, func(k string) string { return env[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "loud") {
		t.Fatalf("run with LOG_LEVEL=loud = %v, want an error naming the value", err)
	}
}

func TestRunRefusesAPublicAdminAddrWithoutToken(t *testing.T) {
	env := map[string]string{"ADMIN_ADDR": "0.0.0.0:9084", "LEDGER_PATH": filepath.Join(t.TempDir(), "l.jsonl")}
	err := run(t.Context(), []string{"reconciler"}, func(k string) string { return env[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ADMIN_TOKEN") {
		t.Fatalf("run with ADMIN_ADDR=0.0.0.0:9084 and no token = %v, want a refusal naming ADMIN_TOKEN", err)
	}
}

func TestRunHelpListsEnvironment(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"reconciler", "-h"}, func(string) string { return "" }, &out); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"HTTP_ADDR (127.0.0.1:8084)", "LEDGER_PATH (reconciler-ledger.jsonl)", "LOG_LEVEL (info)"} {
		if !strings.Contains(out.String(), v) {
			t.Errorf("-h output lacks %q:\n%s", v, out.String())
		}
	}
}
