package harness_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// reconciler builds the reconciler stand-in (it needs no server) once.
func reconciler(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A directory of the process, not of the test: Build is once per process.
	bins, err := harness.BuildTree(ctx, filepath.Join(os.TempDir(), "onceflow-harness-test"), harness.Reconciler)
	if err != nil {
		t.Fatal(err)
	}
	return bins["reconciler"]
}

// startReconciler starts the reconciler stand-in with logLevel, on port 0
// or, with prePick, on ports picked in advance; the test stops it.
func startReconciler(ctx context.Context, t *testing.T, logLevel string, prePick bool) *harness.Proc {
	t.Helper()
	dir := t.TempDir()
	p, err := harness.Start(ctx, harness.Config{Spec: harness.Reconciler, Bin: reconciler(t), LogPath: filepath.Join(dir, "r.log"),
		Env: map[string]string{"LEDGER_PATH": filepath.Join(dir, "ledger.jsonl"), "LOG_LEVEL": logLevel}, PrePickPorts: prePick})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	return p
}

// The addresses come from the program's "listening" line, which it writes
// even with LOG_LEVEL=warn (the load rig's level).
func TestStartReadsTheBoundAddressesAndRestartKeepsThem(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startReconciler(ctx, t, "warn", false)
	if strings.HasSuffix(p.HTTPAddr(), ":0") || strings.HasSuffix(p.AdminAddr(), ":0") || p.HTTPAddr() == p.AdminAddr() {
		t.Fatalf("addresses %q and %q: want the two bound ports", p.HTTPAddr(), p.AdminAddr())
	}
	// Ports a restart must find free again: not ephemeral ones, which any
	// client socket may take while the program is down.
	for _, a := range []string{p.HTTPAddr(), p.AdminAddr()} {
		if port := portOf(t, a); port >= ephemeralLow(t) {
			t.Fatalf("address %s is in the kernel's ephemeral range (from %d): a client socket may take it before a restart", a, ephemeralLow(t))
		}
	}
	if err := p.WaitReady(ctx, "/readyz", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	first, pid := p.URL(), p.Pid()
	if pid == 0 {
		t.Fatal("no pid")
	}

	p.Kill()
	<-p.Done()
	if !harness.Killed(p.ExitErr()) {
		t.Fatalf("after Kill: exit %v, want SIGKILL", p.ExitErr())
	}
	if err := p.Restart(ctx, 10*time.Second, map[string]string{"LOG_LEVEL": "debug"}); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReady(ctx, "/readyz", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if p.URL() != first || p.Pid() == pid {
		t.Fatalf("after Restart: %s pid %d; want %s and a new pid (was %d)", p.URL(), p.Pid(), first, pid)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("a clean SIGTERM: %v", err)
	}
	if n := strings.Count(p.Tail(1000), "=== reconciler start"); n != 2 {
		t.Fatalf("the log marks %d starts, want 2:\n%s", n, p.Tail(50))
	}
}

func TestPrePickedPortsForOldBinaries(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startReconciler(ctx, t, "info", true)
	if strings.HasSuffix(p.HTTPAddr(), ":0") {
		t.Fatalf("address %q: want the picked port", p.HTTPAddr())
	}
	if err := p.WaitReady(ctx, "/readyz", 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestStopReportsAHungSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, err := harness.Start(context.Background(), harness.Config{Name: "stubborn", Bin: "/bin/sh", NoAddrs: true,
		Args: []string{"-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"}, LogPath: filepath.Join(dir, "s.log")})
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the trap is set, or SIGTERM would end the shell at once.
	testinfra.WaitFor(t, 10*time.Second, "the shell to set its trap", func() (bool, error) {
		return strings.Contains(p.Tail(5), "ready"), nil
	})
	if err := p.Stop(300 * time.Millisecond); !errors.Is(err, harness.ErrHung) {
		t.Fatalf("Stop: %v, want ErrHung", err)
	}
	if p.Running() {
		t.Fatal("still running after Stop")
	}
}

func TestStartRefusesAMissingRequiredVariable(t *testing.T) {
	t.Parallel()
	_, err := harness.New(harness.Config{Spec: harness.Shim, Bin: "/bin/true", LogPath: filepath.Join(t.TempDir(), "x.log"),
		Env: map[string]string{"DATABASE_URL": "postgres://x", "KAFKA_BROKERS": "127.0.0.1:1", "BILLING_TOPIC": "t"}})
	if err == nil || !strings.Contains(err.Error(), "CONSUMER_GROUP") || !strings.Contains(err.Error(), "RECONCILER_URL") {
		t.Fatalf("New without CONSUMER_GROUP and RECONCILER_URL: %v", err)
	}
}

func TestCheckSpec(t *testing.T) {
	t.Parallel()
	s := harness.Spec{Name: "x", Env: []harness.Var{{Name: "A"}, {Name: "B"}}}
	if err := harness.CheckSpec(s, []string{"A", "B", "C"}); err != nil {
		t.Fatal(err)
	}
	if err := harness.CheckSpec(s, []string{"A"}); err == nil || !strings.Contains(err.Error(), "B") {
		t.Fatalf("a spec naming B, which the program does not read: %v", err)
	}
}

// A program that never says where it listens cannot be reached or stopped
// by its caller: Start must not leave it running.
func TestStartKillsAProgramThatNeverListens(t *testing.T) {
	t.Parallel()
	p, err := harness.New(harness.Config{Name: "silent", Bin: "/bin/sh", Args: []string{"-c", "sleep 60"},
		LogPath: filepath.Join(t.TempDir(), "s.log"), ListenTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "listening") {
		t.Fatalf("Start: %v, want it to say the program did not log its addresses", err)
	}
	if p.Running() {
		_ = p.Stop(time.Second)
		t.Fatal("Start failed and left the program running")
	}
}

func TestFreePortsAreBelowTheEphemeralRange(t *testing.T) {
	t.Parallel()
	ports, err := harness.FreePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p >= ephemeralLow(t) || seen[p] {
			t.Fatalf("ports %v: want 20 different ones below %d", ports, ephemeralLow(t))
		}
		seen[p] = true
	}
}

// ephemeralLow is the first port the kernel hands out to port-0 binds and
// client sockets.
func ephemeralLow(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatal(err)
	}
	low, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	return low
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return port
}
