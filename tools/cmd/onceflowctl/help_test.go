package main

import (
	"io"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/platform/lifecycle"
)

// -h on the tool and on every command and subcommand prints its usage to
// stdout and exits 0 (it is what was asked for); no command at all is a
// usage error (exit 2).
func TestHelpEverywhereExitsZero(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-h"}, {"status", "-h"}, {"dead-letters", "-h"}, {"dead-letters", "list", "-h"},
		{"dead-letters", "requeue", "-h"}, {"parked", "release", "-h"}, {"parked", "skip", "-h"}, {"replay", "-h"}, {"journey", "-h"}, {"reconcile", "-h"},
	} {
		out, err := ctl(t, nil, args...)
		if code := lifecycle.ExitCode("onceflowctl", err, io.Discard); code != 0 || !strings.Contains(strings.ToLower(out), "usage") {
			t.Errorf("onceflowctl %s: exit %d (%v), output %q; want exit 0 and the usage", strings.Join(args, " "), code, err, out)
		}
	}
	_, err := ctl(t, nil)
	if code := lifecycle.ExitCode("onceflowctl", err, io.Discard); code != 2 {
		t.Errorf("onceflowctl without a command: exit %d (%v), want 2", code, err)
	}
}
