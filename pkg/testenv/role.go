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
// TRUNCATE, not a superuser. It returns dbURL as that role; the role and
// its privileges are dropped when the test ends.
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
		// Cleanups run last in, first out: the database is still there,
		// and its grants (CONNECT among them) hold the role until revoked.
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Errorf("dropping role %s: %v", role, err)
			return
		}
		defer conn.Close(ctx)
		for _, stmt := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := conn.Exec(ctx, stmt); err != nil {
				t.Errorf("dropping role %s: %s: %v", role, stmt, err)
				return
			}
		}
	})
	u.User = url.UserPassword(role, role)
	return u.String()
}
