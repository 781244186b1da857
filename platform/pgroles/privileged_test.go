package pgroles_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// privileged are the calls invariant 9 keeps for the services' own roles:
// writing an event into the WAL (pg_logical_emit_message, which the
// WAL-only relay publishes as genuine) and the advisory locks (the outbox's
// commit trigger takes (1868724273, -1) shared; the relays hold their
// partitions as session locks). A reader that could call them forged a
// PaymentCaptured, and by holding the trigger's lock blocked every outbox
// commit.
var privileged = []string{
	`SELECT pg_logical_emit_message(true, 'onceflow.outbox.v1', '{"eventType":"PaymentCaptured"}')`,
	`SELECT pg_logical_emit_message(true, 'onceflow.outbox.v1', '\x7b7d'::bytea)`,
	`SELECT pg_advisory_lock(1868724273, -1)`,
	`SELECT pg_advisory_lock(42)`,
	`SELECT pg_advisory_lock_shared(1868724273, -1)`,
	`SELECT pg_try_advisory_lock(1868724273, -1)`,
	`SELECT pg_try_advisory_lock_shared(42)`,
	`SELECT pg_advisory_xact_lock(42)`,
	`SELECT pg_advisory_xact_lock_shared(1868724273, -1)`,
	`SELECT pg_try_advisory_xact_lock(1868724273, 0)`,
	`SELECT pg_try_advisory_xact_lock_shared(42)`,
}

// Only the app role (and the owner, which golang-migrate's lock needs) may
// emit into the WAL or take advisory locks; the reader is refused with
// permission denied.
func TestOnlyTheServiceRolesEmitOrTakeAdvisoryLocks(t *testing.T) {
	t.Parallel()
	roles := pgrolestest.Ensure(t, testinfra.NewDatabase(t), "orders", "ro")
	app := connect(t, roles.AppURL)
	owner := connect(t, roles.OwnerURL)
	reader := connect(t, roles.ReaderURLs[0])
	ctx := context.Background()
	for _, q := range privileged {
		if _, err := reader.Exec(ctx, q); !isCode(err, "42501") {
			t.Errorf("%s as the reader: err = %v, want SQLSTATE 42501 (permission denied)", q, err)
			// Let go of what it took, or the app's calls below would wait
			// on it (that is the bug).
			_, _ = reader.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		}
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := app.Exec(callCtx, q)
		cancel()
		if err != nil {
			t.Fatalf("%s as the app role: %v", q, err)
		}
		mustExec(t, app, `SELECT pg_advisory_unlock_all()`)
	}
	mustExec(t, owner, `SELECT pg_advisory_lock(42), pg_advisory_unlock(42)`)
}

// The replication role streams, and does nothing else: it reads no table,
// writes none, and calls none of the privileged functions. Logical decoding
// through pgoutput reads the WAL and the catalogs, not the tables, so it
// needs no SELECT; only an initial table copy (a subscription's table sync)
// would, and the relay takes none (NOEXPORT_SNAPSHOT).
func TestReplicationRoleOnlyStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testinfra.NewDatabase(t)
	roles := pgrolestest.Ensure(t, db, "orders")
	owner := connect(t, roles.OwnerURL)
	mustExec(t, owner, `CREATE TABLE outbox_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload jsonb NOT NULL)`)
	// The owner can create the publication, as migration 0005 does.
	mustExec(t, owner, `CREATE PUBLICATION probe_pub FOR TABLE outbox_events WITH (publish = 'insert')`)
	app := connect(t, roles.AppURL)

	repl := connect(t, roles.ReplicationURL)
	for _, q := range append([]string{
		`SELECT * FROM outbox_events`,
		`INSERT INTO outbox_events (payload) VALUES ('{}')`,
		`CREATE TABLE mine (id int)`,
	}, privileged...) {
		refused(t, repl, q)
	}
	slot := testinfra.Name("probe_slot")
	mustExec(t, repl, `SELECT pg_create_logical_replication_slot('`+slot+`', 'pgoutput')`)
	t.Cleanup(func() { _, _ = connect(t, db).Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot) })
	mustExec(t, app, `INSERT INTO outbox_events (payload) VALUES ('{"n":1}')`)
	var changes int
	if err := repl.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'probe_pub')`, slot).Scan(&changes); err != nil {
		t.Fatalf("decoding the slot as the replication role: %v", err)
	}
	if changes < 3 { // begin, relation, insert, commit
		t.Fatalf("%d pgoutput messages decoded, want the insert's transaction", changes)
	}
}
