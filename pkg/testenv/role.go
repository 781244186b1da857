package testenv

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// RuntimeRole creates a role for this test that may do what a service's
// runtime role may in the database at dbURL, as docs/adopt.md lists it:
// connect, read and write every table and sequence of schema public (as they
// are now: call it after migrating), and nothing else — no DDL, no
// TRUNCATE, not a superuser. It returns dbURL as that role; the role is
// dropped when the test ends, after the database (register it after
// NewDatabase or NewMigratedDatabase).
func RuntimeRole(t testing.TB, dbURL string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("parsing %s: %v", dbURL, err)
	}
	db := pgx.Identifier{u.Path[1:]}.Sanitize()
	role := Name("app")
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("this test needs PostgreSQL: %v\n%s with ONCEFLOW_TEST_PG_URL", err, startHint)
	}
	defer conn.Close(ctx)
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '" + role + "'",
		"GRANT CONNECT ON DATABASE " + db + " TO " + role,
		"GRANT USAGE ON SCHEMA public TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + role,
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO " + role,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("creating the runtime role: %s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, PostgresAdminURL())
		if err != nil {
			t.Errorf("dropping role %s: %v", role, err)
			return
		}
		defer admin.Close(ctx)
		// The database is dropped first (cleanups run last in, first out),
		// and with it the role's privileges in it.
		if _, err := admin.Exec(ctx, "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("dropping role %s: %v", role, err)
		}
	})
	u.User = url.UserPassword(role, role)
	return u.String()
}
