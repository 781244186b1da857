package outbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A poll-only adopter compiles no replication client (issue 31, item 2):
// the log-based relay, which streams from a replication slot through
// pglogrepl, lives in package outbox/cdc, and only a service that imports
// it builds pglogrepl.
func TestPollOnlyAdopterCompilesNoReplicationClient(t *testing.T) {
	t.Parallel()
	const forbidden = "github.com/jackc/pglogrepl"
	// Each package with its imports, so a failure names who pulls it in.
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps .: %v\n%s", err, out)
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
	if !deps["github.com/jackc/pgx/v5"] {
		t.Fatalf("go list -deps . did not list pgx; the command did not run as expected:\n%s", out)
	}
	if deps[forbidden] {
		t.Errorf("package outbox compiles %s (imported by %s): a poll-only adopter should not", forbidden, strings.Join(importers[forbidden], ", "))
	}
}
