// Package wal writes an event into the WAL alone (Emit), for the log-based
// relay's WAL-only mode: package outbox/cdc's Emit is this one, and package
// outbox's requeue of a dead row in that mode emits the row with it. It
// needs no replication client: package outbox/cdc decodes what it writes.
package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/event"
)

// Prefix is the logical decoding message prefix Emit writes under and
// the log-based relay reads; messages under any other prefix are left alone, so other
// tools may emit their own. The prefix names the stream, and a message's
// first byte its encoding (JSON, Binary): the relay reads both, so
// the events an older Emit left in the WAL are published after an upgrade.
const Prefix = "onceflow.outbox.v1"

// The encodings of an emitted event, told apart by the message's first
// byte.
const (
	// JSON ('{') is the envelope as a JSON object built by Postgres
	// (walEnvelope), what Emit wrote before Binary. The relay parses
	// all of it, which cost the WAL-only relay a third of its CPU.
	JSON = '{'
	// Binary is Emit's encoding now, read with no JSON parse: a header
	// Emit builds, the time Postgres emitted it, and the payload as the
	// outbox table's jsonb column holds it, all big-endian:
	//
	//	1 byte   Binary (2)
	//	16       event id
	//	4        event version (int32)
	//	8        aggregate version (int64)
	//	8        occurred at, microseconds since the Unix epoch (int64)
	//	4+n × 6  event type, aggregate type, aggregate id, correlation id,
	//	         causation id, traceparent: each a uint32 length, then UTF-8
	//	8        emitted at (Postgres's clock_timestamp()), microseconds
	//	         since the Unix epoch (int64)
	//	rest     payload: jsonb's text of it
	//
	// A relay older than this encoding refuses such messages as
	// undecodable (logged with their content, counted dead): upgrade the
	// relays before the writers (docs/runbook-cdc.md).
	Binary = 0x02
)

// emitEvent writes the envelope into the WAL only, in Binary's layout:
// $2 is the header Emit builds; Postgres adds the time and the payload,
// which goes through jsonb exactly as the outbox table's payload column
// does, so a consumer gets the same bytes from either relay mode.
// Transactional (true): the message is decoded at the transaction's commit,
// in commit order with the transaction's other changes, and never if it
// rolls back. It emits nothing, and returns no row, unless the server holds
// the relay's slot, which decodes it (SlotHeld): after a failover to a
// server without it, the write is refused, not lost.
const emitEvent = `
SELECT pg_logical_emit_message(true, $1::text,
    $2::bytea || int8send((extract(epoch FROM clock_timestamp()) * 1000000)::bigint) || convert_to($3::jsonb::text, 'UTF8'))
WHERE ` + SlotHeldExpr

// Emit writes ev into the WAL alone, inside the caller's transaction, as a
// logical decoding message (pg_logical_emit_message, transactional): no
// outbox row, no index, no retention. Only the log-based relay (package outbox/cdc) publishes it, at the
// transaction's commit, in commit order; the polling relay never sees it, so
// use Emit only in a service that runs the log-based relay (RELAY_MODE=wal).
// Like Enqueue, it never commits and never talks to Kafka, and an
// incomplete envelope is rejected with an error wrapping event.ErrInvalid.
func Emit(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if err := ev.Validate(); err != nil {
		return fmt.Errorf("outbox: %s %s: %w", ev.EventType, ev.EventID, err)
	}
	tag, err := tx.Exec(ctx, emitEvent, Prefix, EncodeHeader(ev), []byte(ev.Payload))
	if err != nil {
		return fmt.Errorf("outbox: emitting %s %s: %w", ev.EventType, ev.EventID, err)
	}
	if tag.RowsAffected() == 0 {
		// No slot on this server (a failover the relay has not caught up
		// with): nothing would keep the message (SlotHeld).
		return NoSlotErr(fmt.Sprintf("emitting %s %s", ev.EventType, ev.EventID))
	}
	return nil
}

// EncodeHeader is Binary's layout up to the emitted-at time. The
// occurred-at time is truncated to the microsecond, as the outbox table's
// timestamptz stores it, so the occurred-at header is the same in every
// mode.
func EncodeHeader(ev event.Envelope) []byte {
	texts := [...]string{ev.EventType, ev.AggregateType, ev.AggregateID, ev.CorrelationID, ev.CausationID, ev.Traceparent}
	n := 1 + 16 + 4 + 8 + 8
	for _, t := range texts {
		n += 4 + len(t)
	}
	b := make([]byte, 0, n)
	b = append(b, Binary)
	b = append(b, ev.EventID[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(ev.EventVersion))
	b = binary.BigEndian.AppendUint64(b, uint64(ev.AggregateVersion))
	b = binary.BigEndian.AppendUint64(b, uint64(ev.OccurredAt.UnixMicro()))
	for _, t := range texts {
		b = binary.BigEndian.AppendUint32(b, uint32(len(t)))
		b = append(b, t...)
	}
	return b
}

// ErrNoSlot is wrapped by Emit's error when the database it writes to has
// no logical replication slot at a consistent position: after a failover
// to a standby without synchronized slots (PostgreSQL before 17, or a slot
// created without FAILOVER), until the relay has made a new one. The error
// chain also holds a Postgres "cannot connect now" (57P03), so that
// consumers and HTTP handlers treat it as the outage it is (pgerr.IsUnavailable)
// and retry, never dead-letter.
var ErrNoSlot = errors.New("outbox: no replication slot on this server holds what Emit writes yet (a failover; the relay is making one)")

// NoSlotErr is ErrNoSlot with the outage SQLSTATE beside it.
func NoSlotErr(what string) error {
	return fmt.Errorf("outbox: %s: %w: %w", what, ErrNoSlot,
		&pgconn.PgError{Severity: "ERROR", Code: "57P03", Message: "no logical replication slot holds this database's WAL yet"})
}

// SlotHeld is true when the current database has a slot its relay keeps
// (one recorded in outbox_cdc_slots, which the relay writes before it
// creates a slot) that reached a consistent position (confirmed_flush_lsn
// is set once it did: a transaction that sees it, and writes after, is
// decoded) and is not lost. Any other pgoutput slot of the database
// (Debezium's, a subscription's, one made by hand to look at the WAL)
// decodes what Emit writes for its own reader only, and does not count
// (TestWALModeEmitIsNotSatisfiedByAnotherToolsSlot). Read in the writer's
// own transaction, it is about the server that transaction commits on.
const SlotHeld = `SELECT ` + SlotHeldExpr

// SlotHeldExpr is SlotHeld's condition, for a statement's WHERE.
const SlotHeldExpr = `EXISTS (SELECT 1 FROM pg_replication_slots s JOIN outbox_cdc_slots r ON r.slot_name = s.slot_name
               WHERE s.database = current_database() AND s.slot_type = 'logical' AND s.plugin = 'pgoutput'
                 AND s.confirmed_flush_lsn IS NOT NULL AND s.wal_status IS DISTINCT FROM 'lost')`

// CheckSlotHeld returns NoSlotErr unless q's server holds a slot (SlotHeld).
func CheckSlotHeld(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, what string) error {
	var held bool
	if err := q.QueryRow(ctx, SlotHeld).Scan(&held); err != nil {
		return fmt.Errorf("outbox: %s: looking for the replication slot: %w", what, err)
	}
	if !held {
		return NoSlotErr(what)
	}
	return nil
}
