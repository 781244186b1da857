package main

import (
	"bytes"
	"context"
	"os"
	"testing"
)

// The compose init script is generated from package pgroles; a change there
// must be regenerated here, or compose would create other roles than the
// dev stack.
func TestComposeScriptIsUpToDate(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"pgroles", "-script"}, func(string) string { return "" }, &out); err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("../../../devstack/compose/initdb-roles.sql")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, out.Bytes()) {
		t.Fatalf("devstack/compose/initdb-roles.sql is stale: run `go generate ./tools/cmd/pgroles/`")
	}
}
