package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestMain is the TestMain of a package whose tests run the real programs:
// it builds specs (default: Programs) from this checkout once, into a
// temporary directory, and puts their paths in *bins by name; then it runs
// the tests, removes the directory and exits with their code.
func TestMain(m *testing.M, bins *map[string]string, specs ...Spec) {
	dir, err := os.MkdirTemp("", "onceflow-programs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	*bins, err = BuildTree(ctx, dir, specs...)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// StartT runs spec's program from bins (TestMain's) on port 0 with env, its
// log in the test's temporary directory, and returns once it logged its
// addresses; StopT stops it when the test ends.
func StartT(t testing.TB, bins map[string]string, spec Spec, env map[string]string) *Proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	p, err := Start(ctx, Config{Spec: spec, Bin: bins[spec.Name], Env: env, LogPath: filepath.Join(t.TempDir(), spec.Name+".log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { StopT(t, p) })
	return p
}

// StopT sends SIGTERM and waits for a clean exit, as an orchestrator would;
// a program that exits badly, or still runs 30 s after SIGTERM (it is then
// killed), fails the test with the tail of its log.
func StopT(t testing.TB, p *Proc) {
	t.Helper()
	if err := p.Stop(30 * time.Second); err != nil {
		t.Errorf("%v\n%s", err, p.Tail(40))
	}
}
