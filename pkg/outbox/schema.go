package outbox

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the outbox schema as golang-migrate files (NNNN_name.up.sql
// and .down.sql at the root). Apply them in the service's database, tracked
// in MigrationsTable so they version independently of the service's own.
var Migrations, _ = fs.Sub(migrationFiles, "migrations")

// MigrationsTable is the golang-migrate table the outbox schema is tracked in.
const MigrationsTable = "outbox_schema_migrations"

// Partitions is the number of logical partitions aggregates hash into.
const Partitions = 64
