// Package pgrolestest gives a test the least-privilege roles of package
// pgroles on its own database (testinfra.NewDatabase), under names unique to
// the test, and drops them when the test ends.
package pgrolestest

import (
	"context"
	"maps"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/platform/pgroles"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// Roles are the URLs of one database's roles.
type Roles struct {
	// Spec is what was ensured; its role names are unique to the test.
	Spec pgroles.Spec
	// OwnerURL migrates (MIGRATE_DATABASE_URL).
	OwnerURL string
	// AppURL is the runtime role (DATABASE_URL).
	AppURL string
	// ReaderURLs are the URLs of Spec.Readers, in order.
	ReaderURLs []string
	// ReplicationURL is the log-based relay's walsender role
	// (REPLICATION_DATABASE_URL): REPLICATION and CONNECT, nothing else.
	ReplicationURL string
}

// Ensure creates an owner, an app and a replication role (and one reader
// per name in readers) for the database at dbURL, a URL testinfra.NewDatabase returned.
// Call it before the database is migrated, as the dev stack does, or after:
// either way the owner ends up owning the tables. Roles are named after
// service with a random suffix, e.g. orders_3fa2c1_app; reader names get the
// same suffix.
func Ensure(t testing.TB, dbURL, service string, readers ...string) Roles {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("parsing %s: %v", dbURL, err)
	}
	database := strings.TrimPrefix(u.Path, "/")
	prefix := testinfra.Name(service)
	spec := pgroles.ForService(prefix, database, "owner-pw", "app-pw").WithReplication("repl-pw")
	for _, r := range readers {
		spec.Readers = append(spec.Readers, pgroles.Login{Name: prefix + "_" + r, Password: "reader-pw"})
	}
	admin := testinfra.PostgresAdminURL()
	// Registered before Ensure runs so a half-made set is dropped too. It
	// runs before the database's own drop (registered earlier), so the roles'
	// objects and grants there can still be dropped first.
	t.Cleanup(func() { dropRoles(t, admin, database, spec) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgroles.Ensure(ctx, admin, spec); err != nil {
		t.Fatalf("ensuring roles for %s: %v", database, err)
	}
	r := Roles{Spec: spec}
	r.OwnerURL = mustURL(t, dbURL, spec.Owner, database)
	r.AppURL = mustURL(t, dbURL, spec.App, database)
	for _, l := range spec.Readers {
		r.ReaderURLs = append(r.ReaderURLs, mustURL(t, dbURL, l, database))
	}
	r.ReplicationURL = mustURL(t, dbURL, spec.Replication, database)
	return r
}

// ServiceEnv is the environment a service's run starts with in a test, as
// in production with least privilege: both listeners on free loopback
// ports, the runtime role as DATABASE_URL, the owner migrating
// (MIGRATE_DATABASE_URL), and Kafka at brokers. more adds the service's own
// variables.
func (r Roles) ServiceEnv(brokers []string, more map[string]string) map[string]string {
	env := map[string]string{
		"HTTP_ADDR":            "127.0.0.1:0",
		"ADMIN_ADDR":           "127.0.0.1:0",
		"DATABASE_URL":         r.AppURL,
		"MIGRATE_DATABASE_URL": r.OwnerURL,
		"KAFKA_BROKERS":        strings.Join(brokers, ","),
	}
	maps.Copy(env, more)
	return env
}

func mustURL(t testing.TB, base string, l pgroles.Login, database string) string {
	t.Helper()
	u, err := pgroles.URL(base, l, database)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// dropRoles removes the test's roles. Roles that own objects or hold
// privileges cannot be dropped, so what they have in database (if it still
// exists) is dropped first; the test's other databases are gone by now.
func dropRoles(t testing.TB, admin, database string, spec pgroles.Spec) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := []string{spec.Owner.Name, spec.App.Name, spec.Replication.Name}
	for _, r := range spec.Readers {
		names = append(names, r.Name)
	}
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		t.Errorf("dropping roles: %v", err)
		return
	}
	cfg.Database = database
	if conn, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		for _, n := range names {
			_, _ = conn.Exec(ctx, "DROP OWNED BY "+pgx.Identifier{n}.Sanitize())
		}
		conn.Close(ctx)
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Errorf("dropping roles: %v", err)
		return
	}
	defer conn.Close(ctx)
	for _, n := range names {
		// The database-level GRANT CONNECT lives in pg_database; revoke it
		// in case the database is still there.
		_, _ = conn.Exec(ctx, "REVOKE ALL ON DATABASE "+pgx.Identifier{database}.Sanitize()+" FROM "+pgx.Identifier{n}.Sanitize())
		if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{n}.Sanitize()); err != nil {
			t.Errorf("dropping role %s: %v", n, err)
		}
	}
}
