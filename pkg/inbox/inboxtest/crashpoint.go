package inboxtest

import (
	"context"

	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
)

// The consumer's crash points.
const (
	// CrashAfterCommit is after the database commit of a batch of messages
	// and before their offsets are committed: a crash there redelivers
	// events the inbox already holds, and their inbox rows make that a no-op.
	CrashAfterCommit = faultpoint.InboxAfterCommit
	// CrashAfterEffect is, in lease mode, between a message's side effect and
	// marking it done: a crash there leaves the lease to expire, and the next
	// holder asks the third party whether the call landed.
	CrashAfterEffect = faultpoint.InboxAfterEffect
)

// WithCrashPoint returns ctx with hook armed at the consumer's crash points:
// a consumer whose Run gets ctx calls hook with the point's name at each,
// and a non-nil error stops the consumer right there, as a crash would (the
// platform's fault injection kills the process inside hook). In lease mode
// hook is called from concurrent side effects, so it must be safe for
// concurrent use. The points are in no config: a test reaches them here, a
// production binary through pkg/crashpoint (which links no testing). The hook is shared with the relay's point
// (outboxtest.WithCrashPoint arms the same one), so it must tell the points
// apart by name.
func WithCrashPoint(ctx context.Context, hook func(name string) error) context.Context {
	return faultpoint.With(ctx, hook)
}
