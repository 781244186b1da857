// Package pgmigrate applies a service's own golang-migrate files the way
// outbox.Migrate and inbox.Migrate apply the libraries': embedded in the
// binary, tracked in a table of the service's own, so the service's schema
// and each library's version independently in one database. The same files
// and table, handed to the kits as a testenv.Migration, build the tests'
// template database, so the tests run the schema production runs.
//
//	//go:embed migrations/*.sql
//	var migrationFiles embed.FS
//	var Migrations = pgmigrate.Dir(migrationFiles)
//
//	err := pgmigrate.Up(ctx, ownerPool, Migrations, "orders_schema_migrations")
package pgmigrate

import (
	"context"
	"embed"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/internal/pgmigrate"
)

// Dir returns the directory "migrations" of files, where golang-migrate
// wants the NNNN_name.up.sql / .down.sql files: at its root. A missing
// directory shows when Up reads it.
func Dir(files embed.FS) fs.FS { return pgmigrate.Dir(files) }

// Up applies every pending up migration of files (NNNN_name.up.sql at its
// root), recording them in table (name one per service, never the
// libraries': outbox_schema_migrations, inbox_schema_migrations). Run it at
// start-up as the schema's owner. golang-migrate holds an advisory lock
// while it runs, so instances starting at once are safe; it cannot be
// cancelled mid-file: when ctx ends, it stops after the file in progress.
func Up(ctx context.Context, pool *pgxpool.Pool, files fs.FS, table string) error {
	return pgmigrate.Up(ctx, pool, files, table)
}
