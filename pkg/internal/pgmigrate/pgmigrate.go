// Package pgmigrate applies a library's embedded golang-migrate files,
// tracked in a table of the library's own, so the library's schema and the
// service's version independently in one database.
package pgmigrate

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// Dir is the migrations directory of a library's embedded files, where
// golang-migrate wants its files: at the root.
func Dir(files embed.FS) fs.FS {
	dir, err := fs.Sub(files, "migrations")
	if err != nil {
		panic(err) // "migrations" is a valid path: fs.Sub cannot refuse it
	}
	return dir
}

// Up applies every pending up migration of files (NNNN_name.up.sql at its
// root), recording them in table. golang-migrate holds an advisory lock
// while it runs, so instances starting at once are safe. golang-migrate
// cannot be cancelled mid-file: when ctx ends, it stops after the file in
// progress.
func Up(ctx context.Context, pool *pgxpool.Pool, files fs.FS, table string) error {
	src, err := iofs.New(files, ".")
	if err != nil {
		return fmt.Errorf("reading %s migrations: %w", table, err)
	}
	// golang-migrate closes the *sql.DB it is given; one made from the pool
	// leaves the pool itself open.
	db := stdlib.OpenDBFromPool(pool)
	driver, err := migratepgx.WithInstance(db, &migratepgx.Config{MigrationsTable: table})
	if err != nil {
		db.Close()
		return fmt.Errorf("migrating %s: %w", table, err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		return fmt.Errorf("migrating %s: %w", table, err)
	}
	defer m.Close()
	stop := context.AfterFunc(ctx, func() { m.GracefulStop <- true })
	defer stop()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("migrating %s: %w", table, err)
	}
	return ctx.Err()
}
