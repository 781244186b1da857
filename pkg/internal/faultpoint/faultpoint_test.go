package faultpoint_test

import (
	"context"
	"errors"
	"testing"

	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
)

func TestPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if err := faultpoint.Pass(ctx, faultpoint.OutboxAfterAck); err != nil {
		t.Fatalf("no hook: %v", err)
	}
	if got := faultpoint.With(ctx, nil); got != ctx {
		t.Fatal("a nil hook changed the context")
	}
	killed := errors.New("killed")
	var seen []string
	armed := faultpoint.With(ctx, func(name string) error {
		seen = append(seen, name)
		if name == faultpoint.InboxAfterCommit {
			return killed
		}
		return nil
	})
	if err := faultpoint.Pass(armed, faultpoint.OutboxAfterAck); err != nil {
		t.Fatalf("a point the hook lets pass: %v", err)
	}
	err := faultpoint.Pass(armed, faultpoint.InboxAfterCommit)
	if !errors.Is(err, killed) || err.Error() != "crash point inbox.after-commit: killed" {
		t.Fatalf("the armed point = %v, want the hook's error naming the point", err)
	}
	// A context derived from the armed one, as the workers' are, keeps it.
	derived, cancel := context.WithCancel(context.WithoutCancel(armed))
	defer cancel()
	if err := faultpoint.Pass(derived, faultpoint.InboxAfterCommit); !errors.Is(err, killed) {
		t.Fatalf("a derived context lost the hook: %v", err)
	}
	if len(seen) != 3 {
		t.Fatalf("the hook saw %v, want three passes", seen)
	}
}
