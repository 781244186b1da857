package engine

import (
	"os"
	"path/filepath"

	"github.com/onceflow/onceflow/pkg/testenv"
)

// migrations are pkg/inbox's (inbox.Migrations), read from their directory:
// a test of this package cannot import pkg/inbox, which imports it.
var migrations = testenv.Migration{FS: os.DirFS(filepath.Join("..", "..", "migrations")), Table: "inbox_schema_migrations"}
