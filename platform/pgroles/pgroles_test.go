package pgroles_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/platform/pgroles"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// The runtime role reads and writes its tables, and nothing else: DDL,
// TRUNCATE and another service's database are refused; the owner migrates;
// the reader only reads.
func TestRuntimeRoleIsLimitedToItsOwnTables(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ordersDB := testinfra.NewDatabase(t)
	billingDB := testinfra.NewDatabase(t)
	orders := pgrolestest.Ensure(t, ordersDB, "orders", "ro")
	billing := pgrolestest.Ensure(t, billingDB, "billing")

	// The owner migrates: a table, an identity sequence, a trigger function
	// that notifies, as the outbox's migrations do.
	owner := connect(t, orders.OwnerURL)
	mustExec(t, owner, `CREATE TABLE things (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL)`)
	mustExec(t, owner, `CREATE FUNCTION things_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('things', ''); RETURN NULL; END $$`)
	mustExec(t, owner, `CREATE TRIGGER things_notify AFTER INSERT ON things FOR EACH STATEMENT EXECUTE FUNCTION things_notify()`)

	app := connect(t, orders.AppURL)
	// What a service does at run time works.
	for _, q := range []string{
		`INSERT INTO things (name) VALUES ('a'), ('b')`,
		`UPDATE things SET name = 'c' WHERE name = 'a'`,
		`SELECT count(*) FROM things`,
		`DELETE FROM things WHERE name = 'b'`,
		`LISTEN things`,
		`SELECT pg_advisory_lock(42), pg_advisory_unlock(42)`,
		`SELECT pg_notify('things', 'x')`,
	} {
		mustExec(t, app, q)
	}
	// DDL and TRUNCATE are not.
	for _, q := range []string{
		`DROP TABLE things`,
		`ALTER TABLE things ADD COLUMN x int`,
		`TRUNCATE things`,
		`CREATE TABLE other (id int)`,
		`CREATE INDEX things_name_idx ON things (name)`,
		`DROP FUNCTION things_notify()`,
	} {
		refused(t, app, q)
	}
	// Another service's database is not reachable, by the runtime role nor
	// by the owner.
	for _, u := range []string{
		strings.Replace(orders.AppURL, dbName(ordersDB), dbName(billingDB), 1),
		strings.Replace(orders.OwnerURL, dbName(ordersDB), dbName(billingDB), 1),
		strings.Replace(billing.AppURL, dbName(billingDB), dbName(ordersDB), 1),
	} {
		conn, err := pgx.Connect(ctx, u)
		if err == nil {
			conn.Close(ctx)
			t.Fatalf("connecting with %s succeeded, want permission denied", u)
		}
		if !isCode(err, "42501") {
			t.Fatalf("connecting with %s: %v, want SQLSTATE 42501 (permission denied for database)", u, err)
		}
	}
	// The reader reads and writes nothing.
	reader := connect(t, orders.ReaderURLs[0])
	mustExec(t, reader, `SELECT count(*) FROM things`)
	refused(t, reader, `INSERT INTO things (name) VALUES ('r')`)
	refused(t, reader, `DELETE FROM things`)
	// No role is more than a login.
	var wide int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname = ANY($1) AND (rolsuper OR rolcreatedb OR rolcreaterole OR rolreplication OR rolbypassrls)`,
		[]string{orders.Spec.Owner.Name, orders.Spec.App.Name, orders.Spec.Readers[0].Name}).Scan(&wide); err != nil {
		t.Fatal(err)
	}
	if wide != 0 {
		t.Fatalf("%d of the roles have more than LOGIN", wide)
	}
}

// A database migrated by a superuser before the roles existed (a dev stack
// from before this package) is handed to the owner, and the runtime role
// gets its tables; running Ensure again changes nothing.
func TestEnsureAdoptsObjectsASuperuserCreated(t *testing.T) {
	t.Parallel()
	db := testinfra.NewDatabase(t)
	super := connect(t, db)
	mustExec(t, super, `CREATE TABLE legacy (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)`)
	mustExec(t, super, `CREATE FUNCTION legacy_fn() RETURNS int LANGUAGE sql AS 'SELECT 1'`)
	roles := pgrolestest.Ensure(t, db, "legacy")
	var tableOwner, fnOwner string
	if err := super.QueryRow(context.Background(),
		`SELECT pg_get_userbyid(relowner), (SELECT pg_get_userbyid(proowner) FROM pg_proc WHERE proname = 'legacy_fn') FROM pg_class WHERE relname = 'legacy'`).
		Scan(&tableOwner, &fnOwner); err != nil {
		t.Fatal(err)
	}
	if tableOwner != roles.Spec.Owner.Name || fnOwner != roles.Spec.Owner.Name {
		t.Fatalf("legacy is owned by %s and legacy_fn by %s, want %s", tableOwner, fnOwner, roles.Spec.Owner.Name)
	}
	app := connect(t, roles.AppURL)
	mustExec(t, app, `INSERT INTO legacy (v) VALUES ('x')`)
	refused(t, app, `DROP TABLE legacy`)
	// Idempotent: the owner can still alter what it owns after a second run.
	owner := connect(t, roles.OwnerURL)
	mustExec(t, owner, `ALTER TABLE legacy ADD COLUMN w int`)
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connecting with %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func mustExec(t *testing.T, conn *pgx.Conn, q string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// refused checks q fails for lack of privilege (42501) or ownership (42501
// too: "must be owner of table").
func refused(t *testing.T, conn *pgx.Conn, q string) {
	t.Helper()
	_, err := conn.Exec(context.Background(), q)
	if !isCode(err, "42501") {
		t.Fatalf("%s as %s: err = %v, want SQLSTATE 42501 (insufficient privilege)", q, conn.Config().User, err)
	}
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

func dbName(url string) string {
	name := url[strings.LastIndex(url, "/")+1:]
	name, _, _ = strings.Cut(name, "?")
	return name
}

// Script, run on a fresh database as the compose init does, gives the same
// result as Ensure.
func TestScriptGivesTheSameRolesOnAFreshDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testinfra.NewDatabase(t)
	prefix := testinfra.Name("script")
	spec := pgroles.ForService(prefix, dbName(db), "o", "a", pgroles.Login{Name: prefix + "_ro", Password: "r"})
	t.Cleanup(func() {
		admin := connect(t, testinfra.PostgresAdminURL())
		for _, l := range []string{spec.Owner.Name, spec.App.Name, spec.Readers[0].Name} {
			_, _ = admin.Exec(ctx, "REVOKE ALL ON DATABASE "+pgx.Identifier{spec.Database}.Sanitize()+" FROM "+pgx.Identifier{l}.Sanitize())
			_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{l}.Sanitize())
		}
	})
	conn := connect(t, testinfra.PostgresAdminURL())
	t.Cleanup(func() { // the roles' grants and default privileges live in db
		c := connect(t, db)
		for _, l := range []string{spec.Owner.Name, spec.App.Name, spec.Readers[0].Name} {
			_, _ = c.Exec(ctx, "DROP OWNED BY "+pgx.Identifier{l}.Sanitize())
		}
	})
	for _, line := range strings.Split(pgroles.Script(spec), "\n") {
		switch {
		case line == "":
		case strings.HasPrefix(line, `\connect `):
			conn = connect(t, db) // the script has one database
		default:
			mustExec(t, conn, line)
		}
	}
	owner := connect(t, mustURL(t, db, spec.Owner))
	mustExec(t, owner, `CREATE TABLE t (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY)`)
	app := connect(t, mustURL(t, db, spec.App))
	mustExec(t, app, `INSERT INTO t DEFAULT VALUES`)
	refused(t, app, `DROP TABLE t`)
	refused(t, app, `TRUNCATE t`)
	reader := connect(t, mustURL(t, db, spec.Readers[0]))
	mustExec(t, reader, `SELECT * FROM t`)
	refused(t, reader, `DELETE FROM t`)
}

func mustURL(t *testing.T, base string, l pgroles.Login) string {
	t.Helper()
	u, err := pgroles.URL(base, l, dbName(base))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// ScriptWithPasswordVariables runs in psql with the passwords given as
// variables, as devstack/compose/initdb-roles.sh runs it, and sets them.
func TestScriptWithPasswordVariablesRunsInPsql(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatalf("this test needs psql (Debian's postgresql-client, which `make up` installs with the server): %v", err)
	}
	ctx := context.Background()
	db := testinfra.NewDatabase(t)
	prefix := testinfra.Name("vars")
	spec := pgroles.ForService(prefix, dbName(db), "", "", pgroles.Login{Name: prefix + "_ro"})
	names := []string{spec.Owner.Name, spec.App.Name, spec.Readers[0].Name}
	t.Cleanup(func() {
		admin := connect(t, testinfra.PostgresAdminURL())
		for _, l := range names {
			_, _ = admin.Exec(ctx, "REVOKE ALL ON DATABASE "+pgx.Identifier{spec.Database}.Sanitize()+" FROM "+pgx.Identifier{l}.Sanitize())
			_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{l}.Sanitize())
		}
	})
	t.Cleanup(func() {
		c := connect(t, db)
		for _, l := range names {
			_, _ = c.Exec(ctx, "DROP OWNED BY "+pgx.Identifier{l}.Sanitize())
		}
	})
	file := filepath.Join(t.TempDir(), "roles.sql")
	if err := os.WriteFile(file, []byte(pgroles.ScriptWithPasswordVariables(spec)), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"-v", "ON_ERROR_STOP=1", "-q", "-f", file, testinfra.PostgresAdminURL()}
	for _, n := range names {
		args = append(args, "-v", n+"_password=pw-"+n+"-it's")
	}
	if out, err := exec.Command(psql, args...).CombinedOutput(); err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	var withPassword int
	if err := connect(t, testinfra.PostgresAdminURL()).QueryRow(ctx,
		`SELECT count(*) FROM pg_authid WHERE rolname = ANY($1) AND rolpassword IS NOT NULL AND rolcanlogin AND NOT rolsuper`, names).
		Scan(&withPassword); err != nil {
		t.Fatal(err)
	}
	if withPassword != len(names) {
		t.Fatalf("%d of %d roles have a password", withPassword, len(names))
	}
	app := connect(t, mustURL(t, db, spec.App))
	refused(t, app, `CREATE TABLE t (id int)`)
}
