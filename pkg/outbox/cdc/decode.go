package cdc

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
)

// The log-based relay reads pgoutput's messages (protocol version 1, see
// "Logical Replication Message Formats" in the Postgres documentation) in
// place, out of the replication connection's buffer: a stream of a million
// events must not cost a million small copies before anything is
// published. Only what an event keeps is copied, once, by msgBuilder
// (build.go); the buffer is reused by the next message.
//
// Relation messages, a few per stream, go through pglogrepl.Parse.

// pgoutput's message types the relay reads; it skips the others (Type,
// Origin, Update, Delete, Truncate: the publication publishes inserts only).
const (
	pgoBegin    = 'B'
	pgoCommit   = 'C'
	pgoRelation = 'R'
	pgoInsert   = 'I'
	pgoMessage  = 'M'
)

var errShortMessage = errors.New("pgoutput message shorter than its fields")

// beginFinal reads a Begin message (after its type byte): the LSN of its
// transaction's commit record, and its xid.
func beginFinal(b []byte) (pglogrepl.LSN, uint32, error) {
	if len(b) < 8+8+4 { // final LSN, commit time, xid
		return 0, 0, errShortMessage
	}
	return pglogrepl.LSN(binary.BigEndian.Uint64(b)), binary.BigEndian.Uint32(b[16:]), nil
}

// commitEnd reads a Commit message (after its type byte): the position
// just past its transaction, where the slot may be confirmed once all of
// it is acknowledged.
func commitEnd(b []byte) (pglogrepl.LSN, error) {
	if len(b) < 1+8+8+8 { // flags, commit LSN, end LSN, commit time
		return 0, errShortMessage
	}
	return pglogrepl.LSN(binary.BigEndian.Uint64(b[9:])), nil
}

// logicalMessage is a Message message: one call of pg_logical_emit_message.
type logicalMessage struct {
	transactional bool
	lsn           pglogrepl.LSN
	prefix        []byte
	content       []byte
}

func parseLogicalMessage(b []byte) (logicalMessage, error) {
	if len(b) < 1+8 { // flags, LSN
		return logicalMessage{}, errShortMessage
	}
	m := logicalMessage{transactional: b[0]&1 == 1, lsn: pglogrepl.LSN(binary.BigEndian.Uint64(b[1:]))}
	rest := b[9:]
	end := bytes.IndexByte(rest, 0) // the prefix is a C string
	if end < 0 || len(rest) < end+1+4 {
		return logicalMessage{}, errShortMessage
	}
	m.prefix = rest[:end]
	n := binary.BigEndian.Uint32(rest[end+1:])
	rest = rest[end+1+4:]
	if uint64(len(rest)) < uint64(n) {
		return logicalMessage{}, errShortMessage
	}
	m.content = rest[:n]
	return m, nil
}

// parseInsert reads an Insert message (after its type byte): the relation
// and the new tuple's columns into cols (reused: cols[i] is nil for a null
// column and slices b otherwise). It refuses a tuple whose column count is
// not want, the relation's.
func parseInsert(b []byte, want int, cols [][]byte) (uint32, [][]byte, error) {
	if len(b) < 4+1+2 { // relation, 'N', column count
		return 0, cols, errShortMessage
	}
	rel := binary.BigEndian.Uint32(b)
	if b[4] != 'N' {
		return rel, cols, fmt.Errorf("insert of relation %d: tuple type %q, want 'N'", rel, b[4])
	}
	n := int(binary.BigEndian.Uint16(b[5:]))
	if want >= 0 && n != want {
		return rel, cols, fmt.Errorf("insert of relation %d: %d columns, its relation has %d", rel, n, want)
	}
	cols = cols[:0]
	rest := b[7:]
	for range n {
		if len(rest) < 1 {
			return rel, cols, errShortMessage
		}
		kind := rest[0]
		rest = rest[1:]
		switch kind {
		case pglogrepl.TupleDataTypeText, pglogrepl.TupleDataTypeBinary:
			if len(rest) < 4 {
				return rel, cols, errShortMessage
			}
			size := binary.BigEndian.Uint32(rest)
			rest = rest[4:]
			if uint64(len(rest)) < uint64(size) {
				return rel, cols, errShortMessage
			}
			// A non-nil slice even when empty: empty text is not null.
			cols = append(cols, rest[:size:size])
			rest = rest[size:]
		default: // null; unchanged TOAST comes with updates only
			cols = append(cols, nil)
		}
	}
	return rel, cols, nil
}

// rowColumns says where an outbox_events relation keeps the columns the
// relay reads, by position in its tuples (-1: absent). The others
// (partition, state, attempts, the trace columns Debezium reads, …) are
// skipped without being looked at.
type rowColumns struct {
	n int // the relation's column count

	id, eventID, aggType, aggID, aggVersion, eventType, eventVersion int
	payload, headers, occurredAt, createdAt                          int
}

// newRowColumns maps rel's columns, or returns nil if rel is not the
// outbox table.
func newRowColumns(rel *pglogrepl.RelationMessage) *rowColumns {
	if rel.RelationName != "outbox_events" {
		return nil
	}
	c := &rowColumns{n: len(rel.Columns)}
	positions := map[string]*int{
		"id": &c.id, "event_id": &c.eventID, "aggregate_type": &c.aggType, "aggregate_id": &c.aggID,
		"aggregate_version": &c.aggVersion, "event_type": &c.eventType, "event_version": &c.eventVersion,
		"payload": &c.payload, "headers": &c.headers, "occurred_at": &c.occurredAt, "created_at": &c.createdAt,
	}
	for _, p := range positions {
		*p = -1
	}
	for i, col := range rel.Columns {
		if p, ok := positions[col.Name]; ok {
			*p = i
		}
	}
	return c
}

// rawEnvelope is an event's envelope as the relay reads it from the stream:
// its texts are slices of the message being read, valid until the next one
// is received.
type rawEnvelope struct {
	eventID                                 uuid.UUID
	eventType, aggType, aggID               []byte
	correlationID, causationID, traceparent []byte
	eventVersion, aggVersion                int64
	occurredAt                              time.Time
	payload                                 []byte
}

// decodeRow reads an outbox_events insert (pgoutput's text format) into the
// envelope the polling relay reads from the table, and the row's id and
// insert time.
func (c *rowColumns) decodeRow(cols [][]byte, ev *rawEnvelope) (rowID int64, createdAt time.Time, err error) {
	r := tupleReader{cols: cols}
	rowID = readColumn(&r, c.id, "id", parseDecimal)
	ev.eventID = readColumn(&r, c.eventID, "event_id", uuid.ParseBytes)
	ev.aggType = r.text(c.aggType, "aggregate_type")
	ev.aggID = r.text(c.aggID, "aggregate_id")
	ev.aggVersion = readColumn(&r, c.aggVersion, "aggregate_version", parseDecimal)
	ev.eventType = r.text(c.eventType, "event_type")
	ev.eventVersion = readColumn(&r, c.eventVersion, "event_version", parseDecimal)
	ev.payload = r.text(c.payload, "payload")
	if b := r.text(c.headers, "headers"); r.err == nil {
		r.err = ev.readHeaders(b)
	}
	ev.occurredAt = readColumn(&r, c.occurredAt, "occurred_at", parseTimestamptz)
	if r.err == nil && c.createdAt >= 0 && cols[c.createdAt] != nil {
		createdAt, r.err = parseTimestamptz(cols[c.createdAt])
	}
	return rowID, createdAt, r.err
}

// tupleReader reads the columns of one tuple and keeps the first error:
// after it, every read returns a zero value, and decodeRow reports it.
type tupleReader struct {
	cols [][]byte
	err  error
}

// text is column i's text, named name in the error if it is missing (i < 0)
// or null.
func (r *tupleReader) text(i int, name string) []byte {
	if r.err != nil {
		return nil
	}
	if i < 0 || r.cols[i] == nil {
		r.err = fmt.Errorf("column %s is missing or null", name)
		return nil
	}
	return r.cols[i]
}

// readColumn is column i's text read by parse.
func readColumn[T any](r *tupleReader, i int, name string, parse func([]byte) (T, error)) T {
	var v T
	if b := r.text(i, name); r.err == nil {
		v, r.err = parse(b)
	}
	return v
}

// readHeaders reads the headers column (publish.Headers as jsonb). jsonb's
// text is a flat object of strings with no escapes in the rows Enqueue
// writes; it is read in place, and anything else (an escaped character,
// another value type) through encoding/json.
func (ev *rawEnvelope) readHeaders(b []byte) error {
	ev.correlationID, ev.causationID, ev.traceparent = nil, nil, nil
	if scanFlatStrings(b, func(key, value []byte) {
		switch string(key) {
		case "correlationId":
			ev.correlationID = value
		case "causationId":
			ev.causationID = value
		case "traceparent":
			ev.traceparent = value
		}
	}) {
		return nil
	}
	var h publish.Headers
	if err := json.Unmarshal(b, &h); err != nil {
		return fmt.Errorf("column headers: %w", err)
	}
	ev.correlationID, ev.causationID, ev.traceparent = []byte(h.CorrelationID), []byte(h.CausationID), []byte(h.Traceparent)
	return nil
}

// scanFlatStrings calls f with each key and value of b, a JSON object whose
// values are all strings and in which no string holds an escape; it
// reports false, having perhaps called f for some pairs, for anything else.
func scanFlatStrings(b []byte, f func(key, value []byte)) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		key, next, ok := plainString(b, i)
		if !ok {
			return false
		}
		i = skipSpace(b, next)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		value, next, ok := plainString(b, skipSpace(b, i+1))
		if !ok {
			return false
		}
		f(key, value)
		i = skipSpace(b, next)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// plainString reads the JSON string at b[i:] that holds no escape and no
// control character: its contents and the index after its closing quote.
func plainString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// parseDecimal reads Postgres's text form of an integer (int4out, int8out).
func parseDecimal(b []byte) (int64, error) {
	neg := len(b) > 0 && b[0] == '-'
	digits := b
	if neg {
		digits = b[1:]
	}
	if len(digits) == 0 || len(digits) > 19 {
		return 0, fmt.Errorf("%q is not an integer", b)
	}
	var n uint64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not an integer", b)
		}
		n = n*10 + uint64(c-'0')
	}
	if n > 1<<63-1 {
		return 0, fmt.Errorf("%q is out of range", b)
	}
	if neg {
		return -int64(n), nil
	}
	return int64(n), nil
}

// parseTimestamptz reads timestamptz_out's text in the ISO DateStyle the
// replication connection asks for ("2006-01-02 15:04:05.999999+07",
// "…+05:30", "…-03:30:07"), and anything else Postgres may write (BC
// dates, infinity) through pgtype, as the polling relay reads it.
func parseTimestamptz(b []byte) (time.Time, error) {
	if t, ok := parseISOTimestamptz(b); ok {
		return t, nil
	}
	var t time.Time
	if err := timestamptzText.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, b, &t); err != nil {
		return time.Time{}, fmt.Errorf("timestamptz %q: %w", b, err)
	}
	return t, nil
}

// timestamptzText scans timestamptz text outside parseISOTimestamptz's
// shapes. A pgtype.Map is safe for concurrent scans.
var timestamptzText = pgtype.NewMap()

func parseISOTimestamptz(b []byte) (time.Time, bool) {
	// 2006-01-02 15:04:05, then an optional fraction, then the offset.
	if len(b) < 22 || b[4] != '-' || b[7] != '-' || b[10] != ' ' || b[13] != ':' || b[16] != ':' {
		return time.Time{}, false
	}
	num := func(s []byte) (int, bool) {
		n := 0
		for _, c := range s {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	year, ok1 := num(b[0:4])
	month, ok2 := num(b[5:7])
	day, ok3 := num(b[8:10])
	hour, ok4 := num(b[11:13])
	minute, ok5 := num(b[14:16])
	sec, ok6 := num(b[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return time.Time{}, false
	}
	i, nsec := 19, 0
	if b[i] == '.' {
		j := i + 1
		scale := 100_000_000
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			if scale == 0 {
				return time.Time{}, false
			}
			nsec += int(b[j]-'0') * scale
			scale /= 10
			j++
		}
		if j == i+1 {
			return time.Time{}, false
		}
		i = j
	}
	// The offset: +hh, +hh:mm or +hh:mm:ss.
	if i >= len(b) || (b[i] != '+' && b[i] != '-') {
		return time.Time{}, false
	}
	sign := 1
	if b[i] == '-' {
		sign = -1
	}
	offset, rest := 0, b[i+1:]
	for _, unit := range [...]int{3600, 60, 1} {
		if len(rest) < 2 {
			return time.Time{}, false
		}
		n, ok := num(rest[:2])
		if !ok {
			return time.Time{}, false
		}
		offset += n * unit
		if rest = rest[2:]; len(rest) == 0 {
			break
		}
		if rest[0] != ':' || len(rest) == 1 {
			return time.Time{}, false
		}
		rest = rest[1:]
	}
	if len(rest) > 0 {
		return time.Time{}, false
	}
	if month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if t.Day() != day { // a day the month does not have
		return time.Time{}, false
	}
	return t.Add(-time.Duration(sign*offset) * time.Second), true
}
