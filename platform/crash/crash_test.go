package crash_test

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/onceflow/onceflow/platform/crash"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestPointUnarmed(t *testing.T) {
	for _, name := range []string{"", crash.Disabled} {
		f, err := crash.Point(name, 1, quiet, "a")
		if err != nil || f != nil {
			t.Errorf("Point(%q) = %v, %v; want nil func, nil error", name, f != nil, err)
		}
	}
}

func TestPointRejectsUnknownNamesAndCounts(t *testing.T) {
	if _, err := crash.Point("typo", 1, quiet, "a", "b"); err == nil {
		t.Error("an unknown point was accepted")
	}
	if _, err := crash.Point("a", 0, quiet, "a"); err == nil {
		t.Error("CRASH_AFTER=0 was accepted")
	}
}

// TestPointKills runs this test binary again with the point armed on its
// third pass and checks the child died of SIGKILL there, after passing the
// other point and the first two passes.
func TestPointKills(t *testing.T) {
	if os.Getenv("CRASH_TEST_CHILD") == "1" {
		f, err := crash.Point("a", 3, quiet, "a", "b")
		if err != nil {
			os.Exit(2)
		}
		for i := 0; i < 2; i++ {
			_ = f("b")
			_ = f("a")
			os.Stdout.WriteString("passed\n")
		}
		_ = f("a")
		os.Stdout.WriteString("survived\n")
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPointKills$")
	cmd.Env = append(os.Environ(), "CRASH_TEST_CHILD=1")
	out, err := cmd.Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child: %v, output %q; want it killed", err, out)
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v; want SIGKILL", exit)
	}
	if string(out) != "passed\npassed\n" {
		t.Fatalf("child printed %q; want two passes and no survival", out)
	}
}
