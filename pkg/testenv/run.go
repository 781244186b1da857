package testenv

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// RunInBackground runs run (a relay's, a consumer's, a pruner's Run) on its
// own goroutine until the returned stop is called or the test or benchmark
// ends, whichever comes first. stop cancels run's context, waits for run to
// return and reports an error it returned under name: Run returns nil when
// its context ends, so anything else is a failure, and so is a Run still
// running 30 seconds after. stop may be called more than once; only the
// first call stops.
func RunInBackground(tb testing.TB, name string, run func(ctx context.Context) error) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("%s: %v", name, err)
				}
			case <-time.After(30 * time.Second):
				tb.Errorf("%s: Run had not returned 30s after its context ended", name)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}

// LazyPool is a pool that never connects unless used: a test of a
// constructor's validation passes it to show the constructor refuses a bad
// configuration before it touches the database.
func LazyPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// CheckErr fails the test unless err is what want says: nil for "", else an
// error whose message contains want.
func CheckErr(tb testing.TB, err error, want string) {
	tb.Helper()
	switch {
	case want == "" && err != nil:
		tb.Fatalf("want no error, got %v", err)
	case want != "" && err == nil:
		tb.Fatalf("want an error with %q, got none", want)
	case want != "" && !strings.Contains(err.Error(), want):
		tb.Fatalf("want an error with %q, got %v", want, err)
	}
}
