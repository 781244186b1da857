package testenv_test

import (
	"context"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/onceflow/onceflow/pkg/testenv"
)

func migration(sql string) testenv.Migration {
	return testenv.Migration{Table: "kit_schema_migrations", FS: fstest.MapFS{
		"0001_kit.up.sql":   {Data: []byte(sql)},
		"0001_kit.down.sql": {Data: []byte("DROP TABLE kit;")},
	}}
}

// Clones of one migration set, made at once, each get the schema and are
// independent; a changed migration file makes a different template.
func TestNewMigratedDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	set := migration("CREATE TABLE kit (n int); INSERT INTO kit VALUES (1);")
	urls := make([]string, 4)
	var wg sync.WaitGroup
	for i := range urls {
		wg.Go(func() { urls[i] = testenv.NewMigratedDatabase(t, set) })
	}
	wg.Wait()
	for _, u := range urls {
		pool := testenv.NewPool(t, u)
		if _, err := pool.Exec(ctx, "INSERT INTO kit VALUES (2)"); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM kit").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Fatalf("a clone has %d rows, want its own 1 + 1", n)
		}
	}

	changed := testenv.NewPool(t, testenv.NewMigratedDatabase(t,
		migration("CREATE TABLE kit (n int, m int); INSERT INTO kit VALUES (1, 1);")))
	var m int
	if err := changed.QueryRow(ctx, "SELECT m FROM kit").Scan(&m); err != nil {
		t.Fatalf("a changed migration was not applied: %v", err)
	}
}
