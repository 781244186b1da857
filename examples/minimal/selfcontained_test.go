package main

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLibrariesAreSelfContained copies pkg/ alone — the libraries, the
// envelope, their kits and internal packages — into a scratch directory
// outside the tree, with this example beside it, and there builds and vets
// the example against the copy and runs the kits' tests against the running
// stack. Nothing of the platform, the services or the workspace is reachable
// (GOWORK=off), so an import of anything outside pkg/ fails here first.
func TestLibrariesAreSelfContained(t *testing.T) {
	t.Parallel()
	scratch := t.TempDir()
	copyTree(t, filepath.Join("..", "..", "pkg"), filepath.Join(scratch, "onceflow"))
	app := filepath.Join(scratch, "app")
	for _, f := range []string{"main.go", "go.mod", "go.sum"} {
		copyFile(t, f, filepath.Join(app, f))
	}
	// The adopter's module points at its copy, as docs/adopt.md says.
	gomod(t, app, "mod", "edit", "-replace=github.com/onceflow/onceflow/pkg=../onceflow")

	gomod(t, app, "build", "./...")
	gomod(t, app, "vet", "./...")
	lib := filepath.Join(scratch, "onceflow")
	gomod(t, lib, "vet", "./...")
	out := gomod(t, lib, "test", "-count=1", "./outbox/outboxtest/...", "./inbox/inboxtest/...")
	t.Logf("the kits' tests in %s:\n%s", lib, out)
}

// gomod runs go in dir with no workspace, so only what dir's module requires
// (and replaces) is there.
func gomod(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		copyFile(t, path, filepath.Join(to, rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
