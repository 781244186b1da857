// Package pgutil opens Postgres pools and applies golang-migrate migrations
// embedded in the packages that own them.
package pgutil

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// Connect opens a pool on url and pings it, so a wrong URL or a stopped
// server is reported at start-up rather than on the first request.
func Connect(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	return ConnectWatched(ctx, url, maxConns, nil)
}

// ConnectWatched is Connect with watch (nil: none) noting the server each
// new connection reaches.
func ConnectWatched(ctx context.Context, url string, maxConns int32, watch *ServerWatch) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing database URL: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if watch != nil {
		cfg.AfterConnect = watch.afterConnect
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening pool: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to %s@%s:%d/%s: %w (is the dev stack up? run `make up`)",
			cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// Migration is a set of golang-migrate files (NNNN_name.up.sql and
// NNNN_name.down.sql at the root of FS) tracked in its own table, so a
// library's schema and the service's schema version independently in one
// database.
type Migration struct {
	FS    fs.FS
	Table string // e.g. "outbox_schema_migrations"
}

// Migrate applies every pending up migration of each set, in order.
// golang-migrate holds an advisory lock while it runs, so several instances
// starting at once are safe.
func Migrate(pool *pgxpool.Pool, sets ...Migration) error {
	for _, set := range sets {
		// golang-migrate closes the *sql.DB it is given; closing one made
		// from the pool leaves the pool itself open.
		if err := migrateOne(stdlib.OpenDBFromPool(pool), set); err != nil {
			return fmt.Errorf("migrating %s: %w", set.Table, err)
		}
	}
	return nil
}

func migrateOne(db *sql.DB, set Migration) error {
	src, err := iofs.New(set.FS, ".")
	if err != nil {
		db.Close()
		return fmt.Errorf("reading migrations: %w", err)
	}
	driver, err := migratepgx.WithInstance(db, &migratepgx.Config{MigrationsTable: set.Table})
	if err != nil {
		db.Close()
		return err
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return err
	}
	return nil
}
