// Package crash arms a named crash point from a service's configuration, for
// the fault-injection harness (loadtest/prove): at the point, the process
// kills itself with SIGKILL, as an OOM kill or a pulled plug would, so no
// deferred function, rollback or offset commit runs.
//
// A service's run turns its CRASH_POINT and CRASH_AFTER variables into a
// hook with Point, and arms it with Arm. The libraries' crash points
// (crashpoint.OutboxAfterAck, crashpoint.InboxAfterCommit,
// crashpoint.InboxAfterEffect) are in no config: they are reached through
// pkg/crashpoint, in the context the relay's and the consumer's Run get,
// which is what Arm sets. Not through the test kits, which would link
// testing into the services (TestServicesLinkNoTestTooling). A service's own points
// (orders.CrashAfterWrite) take the hook as the service likes. Unset (or
// "none"), Point returns nil and Arm arms nothing: production pays one
// context lookup per point.
package crash

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/onceflow/onceflow/pkg/crashpoint"
)

// Disabled is the CRASH_POINT value that arms nothing (Compose files must set
// every variable, and an empty one counts as unset).
const Disabled = "none"

// Arm returns ctx with hook (from Point; nil arms nothing) armed at the
// libraries' crash points, for every stage a service runs under ctx. Both
// libraries' points share the one hook; hook tells them apart by name.
func Arm(ctx context.Context, hook func(name string) error) context.Context {
	return crashpoint.With(ctx, hook)
}

// Point returns the crash point hook CRASH_POINT names: the process kills
// itself with SIGKILL the after-th time (1 = the first) it passes the point
// called name; other points pass. known lists the points the service has, so a
// misspelt name fails at start instead of never firing. For "" or Disabled it
// returns nil.
func Point(name string, after int, logger *slog.Logger, known ...string) (func(string) error, error) {
	if name == "" || name == Disabled {
		return nil, nil
	}
	if !slices.Contains(known, name) {
		return nil, fmt.Errorf("CRASH_POINT %q is not a crash point of this service (it has %s, or %q)",
			name, strings.Join(known, ", "), Disabled)
	}
	if after < 1 {
		return nil, fmt.Errorf("CRASH_AFTER must be at least 1, got %d", after)
	}
	logger.Warn("crash point armed: this process will kill itself (fault injection)",
		slog.String("crash_point", name), slog.Int("crash_after", after))
	var hits atomic.Int64
	return func(point string) error {
		if point != name || hits.Add(1) != int64(after) {
			return nil
		}
		logger.Warn("crash point reached: SIGKILL", slog.String("crash_point", name), slog.Int("crash_after", after))
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way; nothing after the point may run
	}, nil
}
