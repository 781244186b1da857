package cdc

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/internal/metrics"
	"github.com/onceflow/onceflow/pkg/outbox/internal/wal"
)

// walEnvelope is the JSON shape of an emitted event (wal.JSON).
type walEnvelope struct {
	EventID          uuid.UUID       `json:"eventId"`
	EventType        string          `json:"eventType"`
	EventVersion     int             `json:"eventVersion"`
	AggregateType    string          `json:"aggregateType"`
	AggregateID      string          `json:"aggregateId"`
	AggregateVersion int64           `json:"aggregateVersion"`
	OccurredAt       string          `json:"occurredAt"`
	CorrelationID    string          `json:"correlationId"`
	CausationID      string          `json:"causationId"`
	Traceparent      string          `json:"traceparent"`
	Payload          json.RawMessage `json:"payload"`
	EmittedAt        time.Time       `json:"emittedAt"`
}

// decodeEmitted is the inverse of Emit, for the relay, in either encoding:
// it fills ev (whose texts then point into content) and returns the time
// the event was emitted. A message that is not what Emit writes is refused
// with reason (metrics.RefusedUndecodable or metrics.RefusedInvalid) and err:
// pg_logical_emit_message is an ordinary function, so anything may be under
// the prefix, and the relay must neither publish it as genuine nor stop on
// it.
func decodeEmitted(content []byte, ev *rawEnvelope) (emittedAt time.Time, reason string, err error) {
	switch {
	case len(content) > 0 && content[0] == wal.Binary:
		emittedAt, err = ev.readBinary(content[1:])
	case len(content) > 0 && content[0] == wal.JSON:
		emittedAt, reason, err = ev.readJSON(content)
		if err != nil {
			return time.Time{}, reason, err
		}
	default:
		err = errors.New("neither of the encodings Emit writes")
	}
	if err != nil {
		return time.Time{}, metrics.RefusedUndecodable, fmt.Errorf("decoding an emitted event: %w", err)
	}
	if err := ev.validate(); err != nil {
		return time.Time{}, metrics.RefusedInvalid, fmt.Errorf("event %s: %w", ev.eventID, err)
	}
	return emittedAt, "", nil
}

// readBinary reads wal.Binary's layout after its first byte.
func (ev *rawEnvelope) readBinary(b []byte) (emittedAt time.Time, err error) {
	const fixed = 16 + 4 + 8 + 8
	if len(b) < fixed {
		return time.Time{}, errShortMessage
	}
	ev.eventID = uuid.UUID(b[0:16])
	ev.eventVersion = int64(int32(binary.BigEndian.Uint32(b[16:])))
	ev.aggVersion = int64(binary.BigEndian.Uint64(b[20:]))
	ev.occurredAt = time.UnixMicro(int64(binary.BigEndian.Uint64(b[28:]))).UTC()
	b = b[fixed:]
	for _, field := range [...]*[]byte{&ev.eventType, &ev.aggType, &ev.aggID, &ev.correlationID, &ev.causationID, &ev.traceparent} {
		if len(b) < 4 {
			return time.Time{}, errShortMessage
		}
		n := binary.BigEndian.Uint32(b)
		if uint64(len(b)-4) < uint64(n) {
			return time.Time{}, errShortMessage
		}
		*field, b = b[4:4+n:4+n], b[4+n:]
	}
	if len(b) < 8 {
		return time.Time{}, errShortMessage
	}
	emittedAt = time.UnixMicro(int64(binary.BigEndian.Uint64(b))).UTC()
	ev.payload = b[8:]
	return emittedAt, nil
}

// readJSON reads wal.JSON's object.
func (ev *rawEnvelope) readJSON(content []byte) (emittedAt time.Time, reason string, err error) {
	var w walEnvelope
	if err := json.Unmarshal(content, &w); err != nil {
		return time.Time{}, metrics.RefusedUndecodable, fmt.Errorf("decoding an emitted event: %w", err)
	}
	var occurred time.Time
	if w.OccurredAt != "" {
		if occurred, err = time.Parse(time.RFC3339Nano, w.OccurredAt); err != nil {
			return time.Time{}, metrics.RefusedInvalid, fmt.Errorf("event %s: decoding occurredAt: %w", w.EventID, err)
		}
	}
	*ev = rawEnvelope{
		eventID: w.EventID, eventType: []byte(w.EventType), eventVersion: int64(w.EventVersion),
		aggType: []byte(w.AggregateType), aggID: []byte(w.AggregateID), aggVersion: w.AggregateVersion,
		occurredAt: occurred, correlationID: []byte(w.CorrelationID), causationID: []byte(w.CausationID),
		traceparent: []byte(w.Traceparent), payload: w.Payload,
	}
	if w.EmittedAt.IsZero() {
		w.EmittedAt = occurred
	}
	return w.EmittedAt, "", nil
}

// validate is event.Envelope.Validate for a decoded envelope, without
// making strings of its texts (TestRawEnvelopeValidatesAsTheEnvelope).
func (ev *rawEnvelope) validate() error {
	var missing []string
	if ev.eventID == uuid.Nil {
		missing = append(missing, "event id")
	}
	if len(bytes.TrimSpace(ev.eventType)) == 0 {
		missing = append(missing, "event type")
	}
	if ev.eventVersion < 1 {
		missing = append(missing, "event version (>= 1)")
	}
	if len(bytes.TrimSpace(ev.aggType)) == 0 {
		missing = append(missing, "aggregate type")
	}
	if len(bytes.TrimSpace(ev.aggID)) == 0 {
		missing = append(missing, "aggregate id")
	}
	if ev.aggVersion < 1 {
		missing = append(missing, "aggregate version (>= 1)")
	}
	if ev.occurredAt.IsZero() {
		missing = append(missing, "occurred at")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s", event.ErrInvalid, strings.Join(missing, ", "))
	}
	if y := ev.occurredAt.UTC().Year(); y < 1 || y > 9999 {
		return fmt.Errorf("%w: occurred at is outside the years 1 to 9999 in UTC", event.ErrInvalid)
	}
	for _, f := range [...]struct {
		name string
		v    []byte
		max  int
	}{
		{"event type", ev.eventType, event.MaxNameBytes},
		{"aggregate type", ev.aggType, event.MaxNameBytes},
		{"aggregate id", ev.aggID, event.MaxNameBytes},
		{"correlation id", ev.correlationID, event.MaxNameBytes},
		{"causation id", ev.causationID, event.MaxNameBytes},
		{"traceparent", ev.traceparent, event.MaxTraceparentBytes},
	} {
		switch {
		case len(f.v) > f.max:
			return fmt.Errorf("%w: %s is %d bytes, more than %d", event.ErrInvalid, f.name, len(f.v), f.max)
		case !utf8.Valid(f.v):
			return fmt.Errorf("%w: %s is not valid UTF-8", event.ErrInvalid, f.name)
		case bytes.IndexByte(f.v, 0) >= 0:
			return fmt.Errorf("%w: %s holds a NUL byte", event.ErrInvalid, f.name)
		}
	}
	if ev.eventVersion > event.MaxEventVersion {
		return fmt.Errorf("%w: event version %d is above %d", event.ErrInvalid, ev.eventVersion, event.MaxEventVersion)
	}
	if ev.aggVersion > event.MaxAggregateVersion {
		return fmt.Errorf("%w: aggregate version %d is above %d", event.ErrInvalid, ev.aggVersion, int64(event.MaxAggregateVersion))
	}
	// A scan, not a parse: Postgres wrote the payload as jsonb text, but a
	// message written by hand may hold anything.
	if !utf8.Valid(ev.payload) {
		return fmt.Errorf("%w: payload is not valid UTF-8", event.ErrInvalid)
	}
	if len(ev.payload) == 0 || ev.payload[0] != '{' || !json.Valid(ev.payload) {
		return fmt.Errorf("%w: payload is not a JSON object", event.ErrInvalid)
	}
	return nil
}

// refusedContentShown is how much of a refused message the log shows: enough
// to tell a mistake from a forgery, bounded however large it is.
const refusedContentShown = 1024

// refuseEmitted skips a message under the outbox's prefix that is not a
// valid envelope: it goes dead where the WAL-only mode's dead events go
// (an error log record with its position, reason and content, and
// outbox_dead_total), counted by reason in outbox_emitted_refused_total. It
// is never published, and the stream goes on.
func (r *Relay) refuseEmitted(ctx context.Context, reason string, cause error, lsn pglogrepl.LSN, content []byte) {
	r.cfg.Metrics.DeadTotal.Inc()
	r.cfg.Metrics.CDC.EmittedRefused.WithLabelValues(reason).Inc()
	shown := content
	if len(shown) > refusedContentShown {
		shown = shown[:refusedContentShown]
	}
	r.cfg.Logger.ErrorContext(ctx, "outbox: refused a message in the WAL under the outbox's prefix that is not a valid envelope; "+
		"skipped as dead, never published (only Emit, run by the service's own role, should write there)",
		slog.String("reason", reason), slog.String("lsn", lsn.String()), slog.Int("content_bytes", len(content)),
		slog.String("content", string(shown)), slog.Any("error", cause))
}

// EmitPrefix is the logical decoding message prefix Emit writes under and
// Relay reads; messages under any other prefix are left alone, so other
// tools may emit their own. The prefix names the stream, and a message's
// first byte its encoding: the relay reads both the JSON one an older Emit
// wrote and the binary one it writes now, so the events an older Emit left
// in the WAL are published after an upgrade.
const EmitPrefix = wal.Prefix

// ErrNoSlot is wrapped by Emit's error when the database it writes to has
// no logical replication slot at a consistent position: after a failover
// to a standby without synchronized slots (PostgreSQL before 17, or a slot
// created without FAILOVER), until the relay has made a new one. The error
// chain also holds a Postgres "cannot connect now" (57P03), so that
// consumers and HTTP handlers treat it as the outage it is (pgerr.IsUnavailable)
// and retry, never dead-letter.
var ErrNoSlot = wal.ErrNoSlot

// Emit writes ev into the WAL alone, inside the caller's transaction, as a
// logical decoding message (pg_logical_emit_message, transactional): no
// outbox row, no index, no retention. Only a Relay publishes it, at the
// transaction's commit, in commit order; the polling relay never sees it, so
// use Emit only in a service that runs the log-based relay in
// outbox.ModeWAL. Like outbox.Enqueue, it never commits and never talks to
// Kafka, and an incomplete envelope is rejected with an error wrapping
// event.ErrInvalid. While the server holds no slot that would keep the
// message (a failover the relay has not caught up with), it is refused
// with an error wrapping ErrNoSlot.
func Emit(ctx context.Context, tx pgx.Tx, ev event.Envelope) error { return wal.Emit(ctx, tx, ev) }

// WriteFunc writes one event inside the caller's transaction:
// outbox.Enqueue, or Emit in outbox.ModeWAL (Write picks by mode).
type WriteFunc func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error

// QueueFunc queues the write of events onto the caller's pipeline (see
// outbox.Queue; Queue picks by mode), so that a business transaction and
// its events take one round trip.
type QueueFunc func(b *pgx.Batch, evs ...event.Envelope) error

// Write is the write of mode m: Emit for outbox.ModeWAL, outbox.Enqueue
// otherwise, so that business code calls one function whatever relay runs.
func Write(m outbox.RelayMode) WriteFunc {
	if m == outbox.ModeWAL {
		return Emit
	}
	return outbox.Enqueue
}

// Queue is the queued write of mode m: outbox.Queue, or nil for
// outbox.ModeWAL, whose events are written with Emit (Write) in the
// caller's transaction.
func Queue(m outbox.RelayMode) QueueFunc {
	if m == outbox.ModeWAL {
		return nil
	}
	return outbox.Queue
}
