// Package crashpoint arms the libraries' crash points in a production
// binary, for a fault-injection harness that kills the process at a named
// place (the platform's CRASH_POINT setting, loadtest/prove).
//
// The points themselves are pkg/internal/faultpoint; the test kits
// (outboxtest.WithCrashPoint, inboxtest.WithCrashPoint) reach them for
// tests. A service cannot import the kits for this: they import testing,
// tracetest and the test environment, which would then be linked into every
// production binary (issue 31; platform/crash's TestServicesLinkNoTestTooling
// checks it). This package imports nothing but the standard library and the
// points, so a service reaches them at no cost: without a hook a point is one
// context lookup.
//
// The hook travels in the context that a relay's or a consumer's Run gets,
// never in their configuration, so the points stay out of the libraries' API.
package crashpoint

import (
	"context"

	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
)

// The crash points, by the names a hook is called with (and CRASH_POINT
// takes).
const (
	// OutboxAfterAck is the relay's point, in every mode: between the
	// broker's acknowledgement of a batch and marking its rows published (or
	// confirming the slot's position). A crash there republishes the batch
	// after the restart; the consumers dedupe it.
	OutboxAfterAck = faultpoint.OutboxAfterAck
	// OutboxAfterSlotCreated is the log-based relay's point right after it
	// created a replication slot, before it streams from it.
	OutboxAfterSlotCreated = faultpoint.OutboxAfterSlotCreated
	// InboxAfterCommit is after the database commit of a batch of messages
	// and before their offsets are committed: a crash there redelivers
	// events the inbox already holds, and their inbox rows make that a no-op.
	InboxAfterCommit = faultpoint.InboxAfterCommit
	// InboxAfterEffect is, in lease mode, between a message's side effect
	// and marking it done: the next holder asks the third party whether the
	// call landed.
	InboxAfterEffect = faultpoint.InboxAfterEffect
)

// With returns ctx with hook armed at every crash point of both libraries:
// a relay or consumer whose Run gets ctx calls hook with the point's name,
// and a non-nil error stops that work right there, as a crash would (a
// harness kills the process inside hook). Lease mode calls hook from
// concurrent side effects, so it must be safe for concurrent use. A nil hook
// returns ctx as it is.
func With(ctx context.Context, hook func(name string) error) context.Context {
	return faultpoint.With(ctx, hook)
}
