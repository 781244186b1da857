package lifecycle_test

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pkg/platform/lifecycle"
)

func TestExitCode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		err    error
		code   int
		stderr string
	}{
		{name: "success", err: nil, code: 0, stderr: ""},
		{name: "help", err: fmt.Errorf("parsing: %w", flag.ErrHelp), code: 2, stderr: ""},
		{name: "failure", err: errors.New("database unreachable"), code: 1, stderr: "prog: database unreachable\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stderr strings.Builder
			if got := lifecycle.ExitCode("prog", tc.err, &stderr); got != tc.code {
				t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.code)
			}
			if stderr.String() != tc.stderr {
				t.Errorf("stderr = %q, want %q", stderr.String(), tc.stderr)
			}
		})
	}
}
