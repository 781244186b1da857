package inbox

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the inbox schema as golang-migrate files (NNNN_name.up.sql
// and .down.sql at the root). Apply them in the consuming service's database,
// tracked in MigrationsTable so they version independently of its own.
var Migrations = pgmigrate.Dir(migrationFiles)

// MigrationsTable is the golang-migrate table the inbox schema is tracked in.
const MigrationsTable = "inbox_schema_migrations"

// Migrate applies the inbox schema's pending migrations in pool's database,
// tracked in MigrationsTable. Run it as a role that may create tables (the
// schema's owner); the service's runtime role then needs only to read and
// write them (docs/adopt.md). Teams with a migration tool of their own apply
// Migrations with it instead.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgmigrate.Up(ctx, pool, Migrations, MigrationsTable)
}
