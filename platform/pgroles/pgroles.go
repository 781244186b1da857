package pgroles

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Login is a role that logs in with a password.
type Login struct {
	// Name is the role name, e.g. "reconcile_ro".
	Name string
	// Password is set on every Ensure, so a changed password takes effect.
	// Empty leaves the role without a password (fine under trust auth only).
	Password string
}

// Spec describes one service database and its roles.
type Spec struct {
	// Database is the database the service owns, e.g. "orders".
	Database string
	// Owner runs the migrations and owns the schema objects, e.g. orders_owner.
	Owner Login
	// App is the runtime role, e.g. orders_app.
	App Login
	// Readers get SELECT only, e.g. reconcile_ro. Optional.
	Readers []Login
	// Replication is the log-based relay's walsender role, e.g.
	// orders_repl: LOGIN and REPLICATION, CONNECT on Database, and nothing
	// else — no schema, table or function privilege (see the package
	// documentation for why pgoutput needs none). Optional: a zero Name
	// creates none, for services without an outbox or on the polling relay.
	Replication Login
}

// WithReplication returns s with the conventional walsender role,
// <prefix>_repl where s.Owner is <prefix>_owner (e.g. orders_repl).
func (s Spec) WithReplication(password string) Spec {
	s.Replication = Login{Name: strings.TrimSuffix(s.Owner.Name, "_owner") + "_repl", Password: password}
	return s
}

// ForService returns the conventional Spec for service's database: roles
// <service>_owner and <service>_app with the passwords given.
func ForService(service, database, ownerPassword, appPassword string, readers ...Login) Spec {
	return Spec{
		Database: database,
		Owner:    Login{Name: service + "_owner", Password: ownerPassword},
		App:      Login{Name: service + "_app", Password: appPassword},
		Readers:  readers,
	}
}

// lockKey serializes Ensure across processes: CREATE ROLE and GRANT on
// shared catalogs fail with "tuple concurrently updated" when two sessions
// (parallel tests) change the same role at once.
const lockKey = 7_263_114_051

// Ensure creates or updates the roles of spec and their privileges on
// spec.Database, connecting with adminURL (a superuser URL of any database
// on the server; its database part is replaced to reach spec.Database). It is
// idempotent, and it hands objects created before it ran (by a superuser, for
// example, in a dev stack that predates the roles) to the owner role.
func Ensure(ctx context.Context, adminURL string, spec Spec) error {
	if spec.Database == "" || spec.Owner.Name == "" || spec.App.Name == "" {
		return errors.New("pgroles: Database, Owner.Name and App.Name are required")
	}
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connecting as the admin: %w", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(lockKey)); err != nil {
		return fmt.Errorf("locking: %w", err)
	}
	// Held until admin closes, after the last statement on target below.

	for _, l := range spec.logins() {
		if err := ensureLogin(ctx, admin, l, spec.attributesOf(l)); err != nil {
			return err
		}
	}
	if err := execAll(ctx, admin, databaseStatements(spec)); err != nil {
		return err
	}
	target, err := connectTo(ctx, adminURL, spec.Database)
	if err != nil {
		return err
	}
	defer target.Close(ctx)
	if err := reassign(ctx, target, spec.Owner.Name); err != nil {
		return err
	}
	return execAll(ctx, target, schemaStatements(spec))
}

// logins are every role of s: the owner, the app role, the readers and the
// replication role if any.
func (s Spec) logins() []Login {
	l := append([]Login{s.Owner, s.App}, s.Readers...)
	if s.Replication.Name != "" {
		l = append(l, s.Replication)
	}
	return l
}

// attributesOf are the role attributes of l, one of s's logins: every one
// may log in, only the replication role may also replicate.
func (s Spec) attributesOf(l Login) string {
	if s.Replication.Name != "" && l.Name == s.Replication.Name {
		return replicationAttributes
	}
	return loginAttributes
}

// databaseStatements run in any database: who may connect to spec.Database.
func databaseStatements(spec Spec) []string {
	db := ident(spec.Database)
	stmts := []string{"REVOKE ALL ON DATABASE " + db + " FROM PUBLIC"}
	for _, l := range spec.logins() {
		stmts = append(stmts, "GRANT CONNECT ON DATABASE "+db+" TO "+ident(l.Name))
	}
	// CREATE on its own database lets the owner's migration create the
	// outbox's publication (CREATE PUBLICATION needs it and ownership of
	// the table), so that the replication role needs neither.
	return append(stmts, "GRANT CREATE ON DATABASE "+db+" TO "+ident(spec.Owner.Name))
}

// schemaStatements run in spec.Database: who may do what in schema public,
// now and for the tables the owner creates later.
func schemaStatements(spec Spec) []string {
	owner, app := ident(spec.Owner.Name), ident(spec.App.Name)
	stmts := []string{
		// PG 15 already keeps CREATE on public from PUBLIC; older servers do not.
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT USAGE, CREATE ON SCHEMA public TO " + owner,
		"GRANT USAGE ON SCHEMA public TO " + app,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + app,
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO " + app,
		"ALTER DEFAULT PRIVILEGES FOR ROLE " + owner + " IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO " + app,
		"ALTER DEFAULT PRIVILEGES FOR ROLE " + owner + " IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO " + app,
		privilegedFunctions(spec),
	}
	for _, r := range spec.Readers {
		reader := ident(r.Name)
		stmts = append(stmts,
			"GRANT USAGE ON SCHEMA public TO "+reader,
			"GRANT SELECT ON ALL TABLES IN SCHEMA public TO "+reader,
			"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public GRANT SELECT ON TABLES TO "+reader,
		)
	}
	return stmts
}

// privilegedFunctions is a DO block that takes EXECUTE on the functions
// invariant 9 reserves for the service's own roles away from PUBLIC, in
// spec.Database (functions are per database), and gives it to the app role
// and the owner: pg_logical_emit_message, which writes an event the
// WAL-only relay publishes as genuine, and the advisory lock functions, the
// outbox's commit trigger's and relays' locks (and golang-migrate's, which
// the owner takes). The functions are found by name, so that every
// overload of every server version is covered. One line: Script's callers
// may run it line by line.
func privilegedFunctions(spec Spec) string {
	return `DO $$DECLARE f regprocedure; BEGIN FOR f IN SELECT p.oid::regprocedure FROM pg_proc p ` +
		`WHERE p.pronamespace = 'pg_catalog'::regnamespace AND (p.proname = 'pg_logical_emit_message' OR p.proname ~ '^pg_(try_)?advisory_') LOOP ` +
		`EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f); ` +
		`EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I, %I', f, ` + literal(spec.App.Name) + `, ` + literal(spec.Owner.Name) + `); ` +
		`END LOOP; END $$`
}

// Script returns the same roles and privileges as Ensure for freshly created,
// empty databases, as a psql script (it uses \\connect), for servers set up
// by a script rather than by a program. A role shared by several specs (a
// reader) is created once. Passwords are the specs' own.
func Script(specs ...Spec) string {
	return script(specs, func(l Login) string { return passwordClause(l.Password) })
}

// ScriptWithPasswordVariables is Script with each password left to a psql
// variable named after the role, <role>_password (e.g. orders_app_password),
// so that no secret is written in the script: run it with
// psql -v orders_app_password="$PG_ORDERS_APP_PASSWORD" … -f script. The
// postgres container's init (docker-compose.yml) does.
func ScriptWithPasswordVariables(specs ...Spec) string {
	return script(specs, func(l Login) string { return "PASSWORD :'" + l.Name + "_password'" })
}

func script(specs []Spec, password func(Login) string) string {
	var b strings.Builder
	created := map[string]bool{}
	for _, spec := range specs {
		for _, l := range spec.logins() {
			if created[l.Name] {
				continue
			}
			created[l.Name] = true
			b.WriteString("CREATE ROLE " + ident(l.Name) + " WITH " + spec.attributesOf(l) + " " + password(l) + ";\n")
		}
	}
	for _, spec := range specs {
		b.WriteString("\n")
		for _, s := range databaseStatements(spec) {
			b.WriteString(s + ";\n")
		}
		b.WriteString("\\connect " + ident(spec.Database) + "\n")
		for _, s := range schemaStatements(spec) {
			b.WriteString(s + ";\n")
		}
	}
	return b.String()
}

// ensureLogin creates l if missing and (re)states its attributes, so a role
// that someone widened by hand is narrowed again.
func ensureLogin(ctx context.Context, conn *pgx.Conn, l Login, attributes string) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", l.Name).Scan(&exists); err != nil {
		return fmt.Errorf("looking up role %s: %w", l.Name, err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE ROLE "+ident(l.Name)); err != nil {
			return fmt.Errorf("creating role %s: %w", l.Name, err)
		}
	}
	if _, err := conn.Exec(ctx, "ALTER ROLE "+ident(l.Name)+" WITH "+attributes+" "+passwordClause(l.Password)); err != nil {
		return fmt.Errorf("setting attributes of role %s: %w", l.Name, err)
	}
	return nil
}

// loginAttributes allow logging in and nothing else.
const loginAttributes = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT"

// replicationAttributes are loginAttributes with REPLICATION: a walsender
// connection, nothing more.
const replicationAttributes = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE REPLICATION NOBYPASSRLS INHERIT"

// passwordClause sets password, or none when it is empty.
func passwordClause(password string) string {
	if password == "" {
		return "PASSWORD NULL"
	}
	return "PASSWORD " + literal(password)
}

// reassign gives owner every table, view, standalone sequence and function
// of schema public that another role owns. Sequences behind identity or
// serial columns follow their table and cannot be altered alone.
func reassign(ctx context.Context, conn *pgx.Conn, owner string) error {
	rows, err := conn.Query(ctx, `
SELECT CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
       format('%I.%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
  AND pg_get_userbyid(c.relowner) <> $1
  AND NOT (c.relkind = 'S' AND EXISTS (
      SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i')))
UNION ALL
SELECT 'FUNCTION', p.oid::regprocedure::text
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> $1`, owner)
	if err != nil {
		return fmt.Errorf("listing objects to hand to %s: %w", owner, err)
	}
	var stmts []string
	for rows.Next() {
		var kind, name string
		if err := rows.Scan(&kind, &name); err != nil {
			rows.Close()
			return fmt.Errorf("listing objects to hand to %s: %w", owner, err)
		}
		stmts = append(stmts, "ALTER "+kind+" "+name+" OWNER TO "+ident(owner))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("listing objects to hand to %s: %w", owner, err)
	}
	return execAll(ctx, conn, stmts)
}

func execAll(ctx context.Context, conn *pgx.Conn, stmts []string) error {
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// connectTo connects with adminURL's credentials to database.
func connectTo(ctx context.Context, adminURL, database string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return nil, fmt.Errorf("parsing the admin URL: %w", err)
	}
	cfg.Database = database
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s as the admin: %w", database, err)
	}
	return conn, nil
}

// URL returns baseURL (any URL of the server) with l's credentials and
// database, e.g. the DATABASE_URL of a service's runtime role.
func URL(baseURL string, l Login, database string) (string, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return "", fmt.Errorf("parsing %q: %w", baseURL, err)
	}
	if l.Password != "" {
		u.User = url.UserPassword(l.Name, l.Password)
	} else {
		u.User = url.User(l.Name)
	}
	u.Path = "/" + database
	return u.String(), nil
}

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
