package crash_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The production binaries link no test tooling (issue 31, STYLE.md rule 27):
// the crash points reach them through pkg/crashpoint, not through the
// libraries' test kits, which import testing, tracetest and testenv. A
// binary that links testing also registers its flags (-test.v, …) and
// carries the kits' fakes into production, where nobody wants them.
func TestServicesLinkNoTestTooling(t *testing.T) {
	t.Parallel()
	forbidden := []string{
		"testing",
		"go.opentelemetry.io/otel/sdk/trace/tracetest",
		"github.com/onceflow/onceflow/pkg/outbox/outboxtest",
		"github.com/onceflow/onceflow/pkg/inbox/inboxtest",
		"github.com/onceflow/onceflow/pkg/testenv",
		"github.com/onceflow/onceflow/platform/testinfra",
	}
	// A service without an outbox links no replication client either: the
	// log-based relay is wired in platform/outboxrelay, which only orders
	// and billing import.
	noRelay := []string{"github.com/jackc/pglogrepl", "github.com/onceflow/onceflow/pkg/outbox/cdc"}
	root := filepath.Join("..", "..")
	for cmd, also := range map[string][]string{
		"services/orders/cmd/orders":              nil,
		"services/billing/cmd/billing":            nil,
		"services/reconciler-shim/cmd/shim":       noRelay,
		"services/reconciler-shim/cmd/reconciler": noRelay,
	} {
		t.Run(filepath.Base(cmd), func(t *testing.T) {
			t.Parallel()
			// Each package with its imports, so a failure names who pulls
			// the forbidden one in.
			c := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./"+cmd)
			c.Dir = root
			out, err := c.CombinedOutput()
			if err != nil {
				t.Fatalf("go list -deps ./%s: %v\n%s", cmd, err, out)
			}
			deps := map[string]bool{}
			importers := map[string][]string{}
			for line := range strings.Lines(string(out)) {
				fields := strings.Fields(line)
				if len(fields) == 0 {
					continue
				}
				deps[fields[0]] = true
				for _, imp := range fields[1:] {
					importers[imp] = append(importers[imp], fields[0])
				}
			}
			if len(deps) < 10 {
				t.Fatalf("go list -deps ./%s listed %d packages; the command did not run as expected:\n%s", cmd, len(deps), out)
			}
			for _, f := range append(forbidden[:len(forbidden):len(forbidden)], also...) {
				if deps[f] {
					t.Errorf("%s links %s (imported by %s)", cmd, f, strings.Join(importers[f], ", "))
				}
			}
		})
	}
}
