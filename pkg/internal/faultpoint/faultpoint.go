// Package faultpoint holds the libraries' crash points: named places where
// a fault-injection run (the proofs in loadtest/prove, the libraries' own
// tests) may stop a worker as a kill -9 would, to show that what the
// invariants promise survives a crash right there.
//
// A hook travels in the context that a relay's or a consumer's Run is given,
// never in their configuration: the points are no part of the libraries'
// API. Tests reach them through the test kits (outboxtest.WithCrashPoint,
// inboxtest.WithCrashPoint), production binaries armed by a harness through
// pkg/crashpoint, which links no test tooling. Without a hook a point costs
// one context lookup.
package faultpoint

import (
	"context"
	"fmt"
)

// The crash points, by the names CRASH_POINT takes.
const (
	// OutboxAfterAck is between the broker's acknowledgement of a batch and
	// marking its rows published (or confirming the slot's position): a
	// crash there republishes the batch, and the consumers dedupe it.
	OutboxAfterAck = "outbox.after-ack"
	// OutboxAfterSlotCreated is between the log-based relay's creation of
	// a replication slot (a first start, or the replacement of a lost one)
	// and its streaming from it: a relay frozen or killed there has made a
	// slot that another relay may take, and the rows no slot streamed must
	// still go out before that slot's stream.
	OutboxAfterSlotCreated = "outbox.after-slot-created"
	// InboxAfterCommit is after the database commit of a batch of messages
	// and before their offsets are committed: a crash there redelivers
	// them, and the inbox rows make that a no-op.
	InboxAfterCommit = "inbox.after-commit"
	// InboxAfterEffect is between a leased message's side effect and marking
	// it done: a crash there leaves the lease to expire, and the next holder
	// asks the third party whether the call landed before calling again.
	InboxAfterEffect = "inbox.after-effect"
)

type hookKey struct{}

// With returns ctx with hook armed: every point reached under ctx calls
// hook with the point's name, and a non-nil error aborts the work right
// there. A nil hook returns ctx as it is.
func With(ctx context.Context, hook func(name string) error) context.Context {
	if hook == nil {
		return ctx
	}
	return context.WithValue(ctx, hookKey{}, hook)
}

// Pass is called at the point name: it returns nil when ctx has no hook or
// the hook lets the point pass, and otherwise the hook's error, naming the
// point.
func Pass(ctx context.Context, name string) error {
	hook, _ := ctx.Value(hookKey{}).(func(string) error)
	if hook == nil {
		return nil
	}
	if err := hook(name); err != nil {
		return fmt.Errorf("crash point %s: %w", name, err)
	}
	return nil
}
