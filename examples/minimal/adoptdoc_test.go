package main

import (
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The packages docs/adopt.md may name, by the name it calls them.
var adoptPackages = map[string]string{
	"event":       "github.com/onceflow/onceflow/pkg/event",
	"outbox":      "github.com/onceflow/onceflow/pkg/outbox",
	"cdc":         "github.com/onceflow/onceflow/pkg/outbox/cdc",
	"inbox":       "github.com/onceflow/onceflow/pkg/inbox",
	"outboxtest":  "github.com/onceflow/onceflow/pkg/outbox/outboxtest",
	"outboxadmin": "github.com/onceflow/onceflow/pkg/outbox/outboxadmin",
	"inboxtest":   "github.com/onceflow/onceflow/pkg/inbox/inboxtest",
	"inboxadmin":  "github.com/onceflow/onceflow/pkg/inbox/inboxadmin",
	"lease":       "github.com/onceflow/onceflow/pkg/inbox/lease",
	"leasetest":   "github.com/onceflow/onceflow/pkg/inbox/lease/leasetest",
	"testenv":     "github.com/onceflow/onceflow/pkg/testenv",
	"kafkasafe":   "github.com/onceflow/onceflow/pkg/kafkasafe",
	"pgmigrate":   "github.com/onceflow/onceflow/pkg/pgmigrate",
	"crashpoint":  "github.com/onceflow/onceflow/pkg/crashpoint",
	"pgerr":       "github.com/onceflow/onceflow/pkg/pgerr",
}

// TestAdoptGuideNamesWhatExists type-checks every identifier the adoption
// guide names, in backticks or in its code blocks (`inbox.X`,
// `outbox.RelayConfig.Topic`, `RelayConfig.Topic`, `inboxtest.Deliver`):
// the guide once sent adopters to an inbox.Requeue that never existed
// (issue 31). A renamed or removed name fails here, with the line.
func TestAdoptGuideNamesWhatExists(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "adopt.md"))
	if err != nil {
		t.Fatal(err)
	}
	imp := exportImporter(t)
	pkgs := map[string]*types.Package{}
	for name, path := range adoptPackages {
		p, err := imp.Import(path)
		if err != nil {
			t.Fatalf("type-checking %s: %v", path, err)
		}
		pkgs[name] = p
	}

	// pkg.Name, pkg.Type.Member: anywhere (code blocks are Go).
	qualified := regexp.MustCompile(`\b([a-z]+)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)
	// Type.Member with no package, inside a backtick span: the type must be
	// one of the packages' own.
	span := regexp.MustCompile("`([^`\n]+)`")
	bare := regexp.MustCompile(`^([A-Z]\w*)\.([A-Z]\w*)(?:\(.*\))?$`)
	checked := 0
	for i, line := range strings.Split(string(doc), "\n") {
		at := func(format string, args ...any) {
			t.Errorf("docs/adopt.md:%d: "+format, append([]any{i + 1}, args...)...)
		}
		for _, m := range qualified.FindAllStringSubmatch(line, -1) {
			p, ok := pkgs[m[1]]
			if !ok {
				continue // kafka.Writer, pgxpool.ParseConfig: not ours
			}
			checked++
			obj := p.Scope().Lookup(m[2])
			if obj == nil || !obj.Exported() {
				at("%s.%s does not exist", m[1], m[2])
				continue
			}
			if m[3] != "" && !hasMember(obj, m[3]) {
				at("%s.%s has no field or method %s", m[1], m[2], m[3])
			}
		}
		for _, s := range span.FindAllStringSubmatch(line, -1) {
			m := bare.FindStringSubmatch(s[1])
			if m == nil {
				continue
			}
			var owners []string
			for name, p := range pkgs {
				if obj := p.Scope().Lookup(m[1]); obj != nil {
					if _, isType := obj.(*types.TypeName); isType && hasMember(obj, m[2]) {
						owners = append(owners, name)
					}
				}
			}
			checked++
			if len(owners) == 0 {
				at("no package of the libraries has %s.%s", m[1], m[2])
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked %d identifiers; the guide names far more: is the pattern still right?", checked)
	}
	t.Logf("checked %d identifiers", checked)
}

// exportImporter imports the libraries' packages from the compiler's export
// data, which `go list -export` builds (or finds in the build cache), instead
// of type-checking them and all their dependencies from source.
func exportImporter(t *testing.T) types.Importer {
	t.Helper()
	args := []string{"list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}
	for _, path := range adoptPackages {
		args = append(args, path)
	}
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, out)
	}
	exports := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if path, file, ok := strings.Cut(strings.TrimSpace(line), "\t"); ok && file != "" {
			exports[path] = file
		}
	}
	return importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
}

// hasMember reports whether obj, a type, has the field or method name
// (promoted ones too, through aliases and embedding).
func hasMember(obj types.Object, name string) bool {
	if _, ok := obj.(*types.TypeName); !ok {
		return false
	}
	for _, typ := range []types.Type{obj.Type(), types.NewPointer(obj.Type())} {
		if m, _, _ := types.LookupFieldOrMethod(typ, true, obj.Pkg(), name); m != nil {
			return true
		}
	}
	return false
}
