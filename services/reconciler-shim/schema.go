package shim

import (
	"embed"
	"io/fs"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/platform/pgutil"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the service's own schema as golang-migrate files.
var Migrations, _ = fs.Sub(migrationFiles, "migrations")

// MigrationsTable tracks Migrations; the outbox's schema has its own table.
const MigrationsTable = "shim_schema_migrations"

// Schema is every migration the service's database takes, in the order the
// service applies them at start-up: its own table, then the inbox's. Tests
// migrate their databases with it too.
var Schema = []pgutil.Migration{
	{FS: Migrations, Table: MigrationsTable},
	{FS: inbox.Migrations, Table: inbox.MigrationsTable},
}
