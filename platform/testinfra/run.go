package testinfra

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/testenv"
)

// RunFunc is the signature of every program's run function.
type RunFunc func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error

// Running is a program started by Start.
type Running struct {
	// Logs is everything the program has logged so far.
	Logs *LogBuffer
	stop func() error
}

// Start runs a program's run function with env as its whole environment
// until Stop is called or the test ends, as it would run in production. When
// the test ends, a run that returned an error fails the test with its log.
func Start(t testing.TB, run RunFunc, env map[string]string) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &LogBuffer{}
	done := make(chan error, 1)
	// args[0] is the program name, as in os.Args.
	go func() { done <- run(ctx, []string{"under-test"}, func(k string) string { return env[k] }, logs) }()
	var (
		once sync.Once
		err  error
	)
	r := &Running{Logs: logs}
	r.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("run did not return within 30s of being stopped\n%s", logs.String())
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("run: %v\n%s", err, logs.String())
		}
	})
	return r
}

// Stop ends the program and returns what run returned.
func (r *Running) Stop() error { return r.stop() }

// LogBuffer collects what a program under test logs (testenv.LogBuffer).
type LogBuffer = testenv.LogBuffer
