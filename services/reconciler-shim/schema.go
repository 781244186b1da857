package shim

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the service's own schema as golang-migrate files.
var Migrations, _ = fs.Sub(migrationFiles, "migrations")

// MigrationsTable tracks Migrations; the outbox's schema has its own table.
const MigrationsTable = "shim_schema_migrations"
