package crashpoint_test

import (
	"context"
	"testing"

	"github.com/onceflow/onceflow/pkg/crashpoint"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
)

// The production path and the kits name the same points, so a harness
// that arms CRASH_POINT=inbox.after-commit in a service and a test that
// arms inboxtest.CrashAfterCommit stop at the same place.
func TestSameNamesAsTheKits(t *testing.T) {
	for _, c := range [][2]string{
		{crashpoint.OutboxAfterAck, outboxtest.CrashAfterAck},
		{crashpoint.OutboxAfterSlotCreated, outboxtest.CrashAfterSlotCreated},
		{crashpoint.InboxAfterCommit, inboxtest.CrashAfterCommit},
		{crashpoint.InboxAfterEffect, inboxtest.CrashAfterEffect},
	} {
		if c[0] != c[1] {
			t.Errorf("crashpoint names %q, the kit %q", c[0], c[1])
		}
	}
	if ctx := context.Background(); crashpoint.With(ctx, nil) != ctx {
		t.Error("With(ctx, nil) armed something")
	}
}
