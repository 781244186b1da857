package inbox

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the inbox schema as golang-migrate files (NNNN_name.up.sql
// and .down.sql at the root). Apply them in the consuming service's database,
// tracked in MigrationsTable so they version independently of its own.
var Migrations, _ = fs.Sub(migrationFiles, "migrations")

// MigrationsTable is the golang-migrate table the inbox schema is tracked in.
const MigrationsTable = "inbox_schema_migrations"
