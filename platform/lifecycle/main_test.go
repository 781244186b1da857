package lifecycle_test

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/platform/lifecycle"
)

// Success exits 0 quietly, and so does -h: the usage it asked for is out.
// A command line that is wrong (ErrUsage) exits 2, as the flag package does,
// saying why; any other error 1 with the error on stderr under the
// program's name.
func TestExitCode(t *testing.T) {
	t.Parallel()
	check := func(err error, wantCode int, wantStderr string) {
		t.Helper()
		var stderr strings.Builder
		if got := lifecycle.ExitCode("prog", err, &stderr); got != wantCode || stderr.String() != wantStderr {
			t.Errorf("ExitCode(%v) = %d writing %q, want %d writing %q", err, got, stderr.String(), wantCode, wantStderr)
		}
	}
	check(nil, 0, "")
	check(fmt.Errorf("parsing: %w", flag.ErrHelp), 0, "")
	check(fmt.Errorf("%w: no command given", lifecycle.ErrUsage), 2, "prog: usage: no command given\n")
	check(errors.New("database unreachable"), 1, "prog: database unreachable\n")
}
