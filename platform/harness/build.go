package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// builds remembers, per process, what Build already did: a (root, dir,
// packages) key maps to its result, so that every test that asks again
// shares one build.
var builds sync.Map // string -> *buildOnce

type buildOnce struct {
	once sync.Once
	bins map[string]string
	err  error
}

// Build compiles the programs of specs (every program of the platform when
// none is given) from the source tree at root (where go.work is) into dir,
// and returns each binary's path by Spec.Name. One `go build` compiles them
// all, in parallel. A second call with the same root, dir and programs in
// the same process returns the first call's result: tests share one build.
// The load rig builds an older revision's tree into another dir the same
// way.
func Build(ctx context.Context, root, dir string, specs ...Spec) (map[string]string, error) {
	if len(specs) == 0 {
		specs = Programs
	}
	pkgs := make([]string, len(specs))
	for i, s := range specs {
		pkgs[i] = s.Package
	}
	key := root + "\x00" + dir + "\x00" + strings.Join(pkgs, "\x00")
	v, _ := builds.LoadOrStore(key, &buildOnce{})
	b := v.(*buildOnce)
	b.once.Do(func() { b.bins, b.err = build(ctx, root, dir, specs, pkgs) })
	return b.bins, b.err
}

func build(ctx context.Context, root, dir string, specs []Spec, pkgs []string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	// A trailing separator makes -o a directory: each binary is named
	// after its package's last element.
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building %s in %s: %w\n%s", strings.Join(pkgs, " "), root, err, out)
	}
	bins := make(map[string]string, len(specs))
	for _, s := range specs {
		bins[s.Name] = filepath.Join(dir, s.Name)
	}
	return bins, nil
}

// BuildTree is Build from the repository around the working directory
// (RepoRoot), as the tests of its packages build it.
func BuildTree(ctx context.Context, dir string, specs ...Spec) (map[string]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	return Build(ctx, root, dir, specs...)
}
