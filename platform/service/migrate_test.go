package service

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/pgutil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// Migrations run as the owner when MIGRATE_DATABASE_URL says so, never as a
// runtime role that may not create tables, and not at all with "none".
func TestMigrateUsesTheOwnerAndNeverTriesDDLAsTheRuntimeRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testinfra.NewDatabase(t)
	roles := pgrolestest.Ensure(t, db, "svc")
	app := testinfra.NewPool(t, roles.AppURL)
	super := testinfra.NewPool(t, db)
	opts := Options{Migrations: []pgutil.Migration{{Table: "svc_schema_migrations", FS: fstest.MapFS{
		"0001_things.up.sql":   {Data: []byte(`CREATE TABLE things (id int PRIMARY KEY)`)},
		"0001_things.down.sql": {Data: []byte(`DROP TABLE things`)},
	}}}}
	owner := func() string {
		var o string
		if err := super.QueryRow(ctx, `SELECT coalesce((SELECT tableowner FROM pg_tables WHERE tablename = 'things'), '')`).Scan(&o); err != nil {
			t.Fatal(err)
		}
		return o
	}

	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	for _, skip := range []string{MigrateNone, ""} {
		opts.MigrateDatabaseURL = skip
		if err := migrate(ctx, app, opts, logger); err != nil {
			t.Fatalf("MigrateDatabaseURL=%q as the runtime role: %v", skip, err)
		}
		if o := owner(); o != "" {
			t.Fatalf("MigrateDatabaseURL=%q: table things exists (owner %s), want no migration", skip, o)
		}
	}
	if !strings.Contains(logs.String(), "not migrating") {
		t.Fatalf("no warning that migrations were skipped:\n%s", logs.String())
	}

	opts.MigrateDatabaseURL = roles.OwnerURL
	if err := migrate(ctx, app, opts, logger); err != nil {
		t.Fatal(err)
	}
	if o := owner(); o != roles.Spec.Owner.Name {
		t.Fatalf("things is owned by %q, want %s", o, roles.Spec.Owner.Name)
	}
	// The runtime role uses what the owner made.
	if _, err := app.Exec(ctx, `INSERT INTO things VALUES (1)`); err != nil {
		t.Fatal(err)
	}
}
