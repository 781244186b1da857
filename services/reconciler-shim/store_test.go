package shim_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/pgerr"
	"github.com/onceflow/onceflow/platform/testinfra"
	shim "github.com/onceflow/onceflow/services/reconciler-shim"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

func shimDatabase(t *testing.T) string {
	t.Helper()
	return testinfra.NewMigratedDatabase(t, shim.Schema...)
}

func forward() shim.Forward {
	return shim.Forward{EventID: uuid.New(), EventType: shim.EventPaymentCaptured, OrderID: uuid.New(),
		Kind: thirdparty.KindCapture, Outcome: string(lease.Sent)}
}

// The store answers with its named errors, never with pgx's: what is
// missing, a forward recorded twice, data Postgres refuses (with the cause
// the inbox dead-letters on) and an outage (with the cause it waits out).
func TestStoreNamesDriverErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, proxy := testinfra.ProxyDatabase(t, shimDatabase(t))
	pool := testinfra.NewPool(t, url)
	insert := func(fs ...shim.Forward) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return shim.InsertForwards(ctx, tx, fs) })
	}

	_, err := shim.ReadForward(ctx, pool, uuid.New())
	if !errors.Is(err, shim.ErrNotFound) || errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("a missing forward: %v, want ErrNotFound and no pgx.ErrNoRows", err)
	}
	f := forward()
	if err := insert(f); err != nil {
		t.Fatal(err)
	}
	got, err := shim.ReadForward(ctx, pool, f.EventID)
	if err != nil || got.OrderID != f.OrderID || got.Kind != f.Kind || got.Outcome != f.Outcome || got.ForwardedAt.IsZero() {
		t.Fatalf("ReadForward = %+v, %v; want %+v", got, err, f)
	}
	if err := insert(forward(), f); !errors.Is(err, shim.ErrDuplicate) {
		t.Fatalf("the same event again, beside a new one: %v, want ErrDuplicate", err)
	}
	two := []shim.Forward{forward(), forward()}
	if err := insert(two...); err != nil {
		t.Fatal(err)
	}
	for _, f := range two {
		if got, err := shim.ReadForward(ctx, pool, f.EventID); err != nil || got.OrderID != f.OrderID || got.Outcome != f.Outcome {
			t.Fatalf("ReadForward of one of two = %+v, %v; want %+v", got, err, f)
		}
	}
	bad := forward()
	bad.EventType = "Payment\x00Captured" // 22021: Postgres refuses NUL in text
	if err := insert(bad); !errors.Is(err, shim.ErrInvalidData) || !pgerr.IsPermanent(err) {
		t.Fatalf("a value Postgres refuses: %v, want ErrInvalidData with its cause", err)
	}
	if n, err := shim.CountForwards(ctx, pool); n != 3 || err != nil {
		t.Fatalf("CountForwards = %d, %v; want 3", n, err)
	}

	proxy.Cut()
	if _, err := shim.CountForwards(ctx, pool); !errors.Is(err, shim.ErrUnavailable) || !pgerr.IsUnavailable(err) {
		t.Fatalf("in an outage: %v, want ErrUnavailable with its cause", err)
	}
	pool.Close()
	if _, err := shim.ReadForward(ctx, pool, f.EventID); !errors.Is(err, shim.ErrUnavailable) {
		t.Fatalf("on a closed pool: %v, want ErrUnavailable", err)
	}
}
