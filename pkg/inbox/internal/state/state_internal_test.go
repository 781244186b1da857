package state

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestOnlyStateGoWritesTheLifecycleTables keeps the machine in one file:
// no other source file of the inbox — this package, the engine, pkg/inbox
// and pkg/inbox/lease — inserts into, updates or deletes from the inbox's
// lifecycle tables (DESIGN.md invariant 11, STYLE.md 25).
func TestOnlyStateGoWritesTheLifecycleTables(t *testing.T) {
	t.Parallel()
	write := regexp.MustCompile(`(?i)(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+inbox_(messages|aggregate_versions|dead_keys|parked_messages|dead_letter_originals|operator_actions|servers)\b`)
	var files []string
	for _, dir := range []string{".", filepath.Join("..", "engine"), filepath.Join("..", ".."), filepath.Join("..", "..", "lease")} {
		found, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(found) == 0 {
			t.Fatalf("no Go files in %s: the inbox's packages moved, and this test with them?", dir)
		}
		files = append(files, found...)
	}
	for _, f := range files {
		if f == "state.go" || strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if m := write.Find(src); m != nil {
			t.Errorf("%s writes a lifecycle table (%q): move the statement into state.go as a transition", f, m)
		}
	}
}

// TestEveryTransitionIsDrawn keeps docs/inbox.md's diagram in step with
// state.go: every transition's name appears on an edge of the diagram.
func TestEveryTransitionIsDrawn(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "docs", "inbox.md"))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(doc), "stateDiagram-v2")
	if i < 0 {
		t.Fatal("docs/inbox.md has no stateDiagram-v2")
	}
	diagram := string(doc[i:])
	diagram = diagram[:strings.Index(diagram, "```")]
	for _, tr := range Lifecycle {
		if !strings.Contains(diagram, ": "+tr.Name) {
			t.Errorf("transition %s (%s) is not on docs/inbox.md's diagram", tr.Name, tr.By)
		}
	}
}

// TestNoUpsertOverwritesWithoutAState: an INSERT … ON CONFLICT DO UPDATE
// must say which state it overwrites (STYLE.md 25).
func TestNoUpsertOverwritesWithoutAState(t *testing.T) {
	t.Parallel()
	for _, tr := range Lifecycle {
		sql := strings.ToUpper(tr.SQL)
		i := strings.Index(sql, "DO UPDATE")
		if i < 0 {
			continue
		}
		if rest := sql[i:]; !strings.Contains(rest, "WHERE") {
			t.Errorf("transition %s upserts with no WHERE on the state it overwrites", tr.Name)
		}
	}
}
