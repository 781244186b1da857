package cdc_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/pgerr"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Issue 32: after a Postgres failover to a standby that has no copy of the
// relay's slot (PostgreSQL 15, or a slot without FAILOVER), a WAL-only
// service took writes before its relay had made a new slot on the promoted
// server, and every event emitted in between was kept by nothing (17–30
// OrderPlaced and 18 PaymentCaptured never published, in an independent
// check). Prepare guards only the first start. Here the slot goes as a
// promotion takes it; until the relay holds one again, Emit refuses with
// an outage error (retried, never dead-lettered) and SlotReady says not
// ready; once it does, writes are taken and published.
func TestWALModeRefusesWritesUntilTheRelayHoldsASlotAgain(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	cfg := e.config()
	cfg.Mode = outbox.ModeWAL
	e.loseSlot(t, cfg, emit) // "a"/1 published, then the slot is gone
	ctx := context.Background()

	err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error { return cdc.Emit(ctx, tx, newEvent("a", 2)) })
	if !errors.Is(err, cdc.ErrNoSlot) || !pgerr.IsUnavailable(err) {
		t.Fatalf("Emit with no slot on the server: got %v, want an outage wrapping cdc.ErrNoSlot "+
			"(the event would be kept by nothing)", err)
	}
	relay := newCDC(t, e.Pool, e.W, cfg)
	if err := relay.SlotReady(ctx); !errors.Is(err, cdc.ErrNoSlot) {
		t.Fatalf("SlotReady with no slot: %v, want ErrNoSlot", err)
	}
	runCDC(t, relay)
	testenv.WaitFor(t, 20*time.Second, "the relay to hold a slot again", func() (bool, error) {
		return relay.SlotReady(ctx) == nil, nil
	})
	emit(t, e.Pool, newEvent("a", 2))
	testenv.WaitFor(t, 20*time.Second, "the event written once the slot is back", func() (bool, error) {
		return e.C.Distinct() == 2, nil
	})
}

// Issue 32: Emit's check must be for a slot a relay of this database
// keeps (recorded in outbox_cdc_slots), not for any pgoutput slot: another
// tool's slot in the same database (Debezium's, a subscription's, one made
// by hand to look at the WAL) decodes the emitted message for that tool
// only, and no relay publishes it. Before the fix such a slot satisfied
// Emit while the relay's own was gone: the write was taken, and the event
// kept by nothing the relay reads.
func TestWALModeEmitIsNotSatisfiedByAnotherToolsSlot(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	cfg := e.config()
	cfg.Mode = outbox.ModeWAL
	e.loseSlot(t, cfg, emit) // "a"/1 published, then the relay's slot is gone
	ctx := context.Background()
	other := newSlot(t, e.Pool)
	if _, err := e.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, other); err != nil {
		t.Fatal(err)
	}

	err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error { return cdc.Emit(ctx, tx, newEvent("a", 2)) })
	if !errors.Is(err, cdc.ErrNoSlot) {
		t.Fatalf("Emit while only another tool's slot (%s) holds the database's WAL: got %v, want ErrNoSlot "+
			"(the relay's slot %s is gone: the event would be decoded for that tool alone)", other, err, e.slot)
	}
	if err := newCDC(t, e.Pool, e.W, cfg).SlotReady(ctx); !errors.Is(err, cdc.ErrNoSlot) {
		t.Fatalf("SlotReady while only another tool's slot exists: %v, want ErrNoSlot", err)
	}
}

// Issue 32: on PostgreSQL 17 the relay creates its slot with FAILOVER, so
// that a standby running with sync_replication_slots keeps a copy it
// resumes from after a promotion (docs/operations.md); before 17 there is
// no such slot, and it creates an ordinary one. Run it against the dev
// stack's 15 and against a 17 (ONCEFLOW_PG_VERSION=17 devstack/stack.sh up,
// ONCEFLOW_TEST_PG_URL).
func TestCDCSlotIsAFailoverSlotFromPostgres17(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	runStreaming(t, newCDC(t, e.Pool, e.W, e.config()))
	ctx := context.Background()
	var version string
	if err := e.Pool.QueryRow(ctx, `SHOW server_version_num`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	num, _ := strconv.Atoi(version)
	if num < 170000 {
		var n int
		if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&n); err != nil || n != 1 {
			t.Fatalf("PostgreSQL %d: want the slot created, got %d (%v)", num, n, err)
		}
		return
	}
	var failover bool
	if err := e.Pool.QueryRow(ctx, `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&failover); err != nil {
		t.Fatal(err)
	}
	if !failover {
		t.Fatalf("PostgreSQL %d: the relay's slot was created without FAILOVER: a promoted standby would not have it", num)
	}
}
