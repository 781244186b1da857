package testenv

import (
	"context"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// standbyHint is how to get a primary with a streaming standby.
const standbyHint = `this test needs ONCEFLOW_TEST_PG_URL to name a primary with a streaming standby (through a physical slot) on this machine, and the build tag standby:
  make test-standby
(or: ONCEFLOW_STACK_DIR=/tmp/standby-stack ONCEFLOW_PG_PORT=26532 ONCEFLOW_PG_STANDBY=1 devstack/stack.sh up postgres, then
  ONCEFLOW_TEST_PG_URL=postgres://postgres:postgres@127.0.0.1:26532/postgres?sslmode=disable go test -tags standby -run Standby ./pkg/...)`

// FreezeStandby stops the primary's walsender to its standby (SIGSTOP), as
// a standby that falls behind or a cut network does: the primary goes on
// committing, the standby receives nothing. The walsender goes on when the
// returned thaw is called or the test ends. There is one walsender per
// standby, so tests that freeze it must not run in parallel, nor in two
// packages at once (one's thaw would end the other's freeze: make
// test-standby runs go test -p 1).
func FreezeStandby(t testing.TB, pool *pgxpool.Pool) (thaw func()) {
	t.Helper()
	var pid int
	err := pool.QueryRow(context.Background(), `SELECT coalesce(min(active_pid), 0) FROM pg_replication_slots
		WHERE slot_type = 'physical' AND active`).Scan(&pid)
	if err != nil || pid == 0 {
		t.Fatalf("no standby streams from this server through a physical slot (%v)\n%s", err, standbyHint)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("freezing the walsender %d (the server must run on this machine, as this user): %v\n%s", pid, err, standbyHint)
	}
	thawed := false
	thaw = func() {
		if !thawed {
			thawed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	return thaw
}
