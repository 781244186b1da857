package outboxtest

import (
	"context"

	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
)

// CrashAfterAck is the relay's crash point, in every mode: between the
// broker's acknowledgement of a batch and marking its rows published (or
// confirming the slot's position). A crash there republishes the batch
// after the restart; the consumers dedupe it.
const CrashAfterAck = faultpoint.OutboxAfterAck

// CrashAfterSlotCreated is the log-based relay's point right after it
// created a replication slot, before it streams from it: a relay that
// freezes or dies there leaves a new slot to the others, and the rows that
// no slot streamed (a lost slot's gap) must still go out first.
const CrashAfterSlotCreated = faultpoint.OutboxAfterSlotCreated

// WithCrashPoint returns ctx with hook armed at the relay's crash point: a
// relay whose Run gets ctx calls hook(CrashAfterAck) there, and a non-nil
// error aborts the batch right there, as a crash would (the platform's
// fault injection kills the process inside hook). The point is in no
// config: a test reaches it here, a production binary through
// pkg/crashpoint (which links no testing). The
// hook is shared with the inbox's points (inboxtest.WithCrashPoint arms the
// same one), so it must tell the points apart by name.
func WithCrashPoint(ctx context.Context, hook func(name string) error) context.Context {
	return faultpoint.With(ctx, hook)
}
