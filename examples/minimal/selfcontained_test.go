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
// outside the tree, with this example beside it (its program, migrations and
// handler tests), and there tidies, builds, vets and tests the example
// against the copy, and runs the kits' tests, against the running stack.
// Nothing of the platform, the services or the workspace is reachable
// (GOWORK=off), so an import of anything outside pkg/ fails here first.
func TestLibrariesAreSelfContained(t *testing.T) {
	t.Parallel()
	scratch := t.TempDir()
	copyTree(t, filepath.Join("..", "..", "pkg"), filepath.Join(scratch, "onceflow"))
	app := filepath.Join(scratch, "app")
	copyExample(t, app)
	// The adopter's module points at its copy, as docs/adopt.md says.
	gomod(t, app, "mod", "edit", "-replace=github.com/onceflow/onceflow/pkg=../onceflow")

	// An adopter's first `go mod tidy` must not move the drivers past the
	// versions the libraries were tested with (issue 31): the example's
	// go.mod lists them at pkg/go.mod's versions, which tidy keeps.
	tidy := exec.Command("go", "mod", "tidy")
	tidy.Dir = app
	tidy.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := tidy.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy in %s: %v\n%s", app, err, out)
	}
	lib := filepath.Join(scratch, "onceflow")
	for _, dep := range []string{"github.com/jackc/pgx/v5", "github.com/segmentio/kafka-go"} {
		if got, want := required(t, app, dep), required(t, lib, dep); got != want {
			t.Errorf("after go mod tidy the example requires %s %s, pkg/go.mod pins %s", dep, got, want)
		}
	}

	gomod(t, app, "build", "./...")
	gomod(t, app, "vet", "./...")
	out := gomod(t, app, "test", "-count=1", "./...")
	t.Logf("the example's tests in %s:\n%s", app, out)
	gomod(t, lib, "vet", "./...")
	out = gomod(t, lib, "test", "-count=1", "./outbox/outboxtest/...", "./inbox/inboxtest/...")
	t.Logf("the kits' tests in %s:\n%s", lib, out)
}

// copyExample copies this example, as an adopter would take it, to dir:
// everything but the tests that check it against this repository.
func copyExample(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Base(path) {
		case "selfcontained_test.go", "adoptdoc_test.go":
			return nil
		}
		copyFile(t, path, filepath.Join(dir, path))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// required returns the version of dep that the go.mod in dir requires.
func required(t *testing.T, dir, dep string) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", dep)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m %s in %s: %v\n%s", dep, dir, err, out)
	}
	return strings.TrimSpace(string(out))
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
