package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/internal/pgmigrate"
)

// Migration is a set of golang-migrate files (NNNN_name.up.sql at the root
// of FS) tracked in Table: outbox.Migrations with outbox.MigrationsTable,
// inbox.Migrations with inbox.MigrationsTable, or a service's own.
type Migration struct {
	FS    fs.FS
	Table string
}

// NewMigratedDatabase is NewDatabase with sets already applied: it clones a
// template database (CREATE DATABASE … TEMPLATE) that holds exactly those
// migrations, which takes a few milliseconds where running the migrations
// takes hundreds. The template is made once per distinct set of migration
// files, by whichever test process gets there first, and kept on the server
// for later runs; its name carries a hash of the files, so editing a
// migration makes a new template rather than reusing a stale one.
func NewMigratedDatabase(t testing.TB, sets ...Migration) string {
	t.Helper()
	if len(sets) == 0 {
		return NewDatabase(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := PostgresAdminURL()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("this test needs PostgreSQL: %v\n%s with ONCEFLOW_TEST_PG_URL", err, startHint)
	}
	defer conn.Close(ctx)
	sum, err := migrationsHash(sets)
	if err != nil {
		t.Fatalf("hashing migrations: %v", err)
	}
	template := "tmpl_" + sum[:24]
	if err := ensureTemplate(ctx, conn, admin, template, sum, sets); err != nil {
		t.Fatalf("making template database %s: %v", template, err)
	}
	name := Name("test")
	if err := cloneDatabase(ctx, conn, name, template); err != nil {
		t.Fatalf("cloning template database %s: %v", template, err)
	}
	dropOnCleanup(t, admin, name)
	return databaseURL(t, admin, name)
}

// migrationsHash identifies a list of migration sets by their tables and the
// names and contents of their files, in order.
func migrationsHash(sets []Migration) (string, error) {
	h := sha256.New()
	for _, set := range sets {
		fmt.Fprintf(h, "table %s\n", set.Table)
		var names []string
		err := fs.WalkDir(set.FS, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				names = append(names, path)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		sort.Strings(names)
		for _, n := range names {
			b, err := fs.ReadFile(set.FS, n)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, "file %s %d\n", n, len(b))
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ensureTemplate makes the template database unless it exists. An advisory
// lock keyed by the hash serialises the test processes (go test runs one
// per package, in parallel) that need the same template, so it is built once;
// the migrations run in a scratch database renamed to the template's name
// only when they have all succeeded, so a process killed half-way never
// leaves a half-migrated template behind.
func ensureTemplate(ctx context.Context, conn *pgx.Conn, admin, template, sum string, sets []Migration) error {
	key := int64(binary.BigEndian.Uint64(mustHex(sum[:16])))
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return fmt.Errorf("locking: %w", err)
	}
	defer func() {
		// The session ends with conn anyway; unlocking early lets the
		// next process in at once.
		_, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", key)
	}()
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", template).Scan(&exists); err != nil {
		return fmt.Errorf("looking for it: %w", err)
	}
	if exists {
		return nil
	}
	scratch := Name("tmplbuild")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+scratch); err != nil {
		return fmt.Errorf("creating: %w", err)
	}
	u, err := url.Parse(admin)
	if err != nil {
		return fmt.Errorf("parsing ONCEFLOW_TEST_PG_URL: %w", err)
	}
	u.Path = "/" + scratch
	pool, err := pgxpool.New(ctx, u.String())
	if err == nil {
		err = Migrate(pool, sets...)
		pool.Close()
	}
	if err != nil {
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+scratch+" WITH (FORCE)")
		return fmt.Errorf("migrating: %w", err)
	}
	// The pool's backends may still be exiting; a rename and a clone both
	// need the database to have no connections, and FORCE is not an option
	// of ALTER DATABASE, so end them ourselves.
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", scratch); err != nil {
		return fmt.Errorf("closing its connections: %w", err)
	}
	if err := retryInUse(ctx, func() error {
		_, err := conn.Exec(ctx, "ALTER DATABASE "+scratch+" RENAME TO "+template)
		return err
	}); err != nil {
		return fmt.Errorf("renaming: %w", err)
	}
	// IS_TEMPLATE marks it for what it is in \l and lets DROP refuse it by
	// accident; ALLOW_CONNECTIONS false keeps anyone from holding a session
	// on it, which would make every clone fail.
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+template+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("marking as template: %w", err)
	}
	return nil
}

// cloneDatabase creates name as a copy of template.
func cloneDatabase(ctx context.Context, conn *pgx.Conn, name, template string) error {
	return retryInUse(ctx, func() error {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+template)
		return err
	})
}

// retryInUse retries f while Postgres says a database is in use (55006,
// object_in_use): a backend that just disconnected from it takes a moment
// to exit.
func retryInUse(ctx context.Context, f func() error) error {
	for wait := 10 * time.Millisecond; ; wait *= 2 {
		err := f()
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" || wait > 5*time.Second {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// Migrate applies every pending up migration of each set to pool's database.
func Migrate(pool *pgxpool.Pool, sets ...Migration) error {
	for _, set := range sets {
		if err := pgmigrate.Up(context.Background(), pool, set.FS, set.Table); err != nil {
			return err
		}
	}
	return nil
}
