package outbox

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the outbox schema as golang-migrate files (NNNN_name.up.sql
// and .down.sql at the root). Apply them in the service's database, tracked
// in MigrationsTable so they version independently of the service's own.
var Migrations = pgmigrate.Dir(migrationFiles)

// MigrationsTable is the golang-migrate table the outbox schema is tracked in.
const MigrationsTable = "outbox_schema_migrations"

// partitionCount is the number of logical partitions aggregates hash into (the
// relays share them out; docs/outbox.md).
const partitionCount = 64

// Migrate applies the outbox schema's pending migrations in pool's database,
// tracked in MigrationsTable. Run it as a role that may create tables (the
// schema's owner); the service's runtime role then needs only to read and
// write them (docs/adopt.md). Teams with a migration tool of their own apply
// Migrations with it instead.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgmigrate.Up(ctx, pool, Migrations, MigrationsTable)
}
