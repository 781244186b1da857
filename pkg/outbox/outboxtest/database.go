package outboxtest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// NewDatabase returns a pool on a fresh database of this test's own, with
// the outbox's schema and then more (a service's own migrations), dropped
// when the test ends. It is cloned from a template migrated once per set of
// migrations, so tests that call it may run in parallel. The server is the
// one ONCEFLOW_TEST_PG_URL names (default: the dev stack's).
func NewDatabase(t testing.TB, more ...testenv.Migration) *pgxpool.Pool {
	t.Helper()
	sets := append([]testenv.Migration{{FS: outbox.Migrations, Table: outbox.MigrationsTable}}, more...)
	return testenv.NewPool(t, testenv.NewMigratedDatabase(t, sets...))
}
