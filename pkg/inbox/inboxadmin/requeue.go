package inboxadmin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/internal/dlt"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"
)

// ErrInvalidFilter is wrapped by the error of a RequeueDeadLetters whose
// filter selects nothing explicitly, contradicts itself, or carries a limit
// or a cursor that is not valid.
var ErrInvalidFilter = errors.New("inbox: invalid requeue filter")

// MaxRequeueLimit is the most dead letters one RequeueDeadLetters call sends
// back, and the default of RequeueFilter.Limit.
const MaxRequeueLimit = 1000

// requeueScanLimit bounds how many dead letters one call reads, requeued or
// passed over, so that a call over a topic of letters requeued long ago
// also ends soon, with a cursor to go on from.
const requeueScanLimit = 10 * MaxRequeueLimit

// RequeueFilter selects the dead letters RequeueDeadLetters sends back, and
// how many per call. A dead letter matches when it matches every field that
// is set.
//
// A filter without EventIDs (All, or Consumer alone) is a sweep: it sends
// back only the dead letters that are still pending, those whose consumer
// still holds the dead_lettered inbox row of their event. Requeuing marks
// that row requeued, so a sweep sends each dead-lettering back once, a
// second sweep finds nothing left, and two sweeps at once never send the
// same one twice.
// A dead letter with no such row (a message that was not an event, or whose
// row Postgres refused) is passed over by a sweep: name its event id to send
// it back.
//
// A filter with EventIDs sends back every dead letter of those events, row
// or not: the caller said exactly what it wants, including an event that was
// requeued before.
type RequeueFilter struct {
	// Consumer selects the dead letters of one consumer (inbox.Config.Name).
	Consumer string
	// EventIDs selects the dead letters of these events. A message that was
	// not an event (it had no readable event id) never matches.
	EventIDs []uuid.UUID
	// All requeues every pending dead letter of the topic (of Consumer, if
	// set). A filter with neither Consumer nor EventIDs needs it, so that a
	// forgotten filter never floods a topic. It cannot be combined with
	// EventIDs.
	All bool
	// Limit is the most dead letters one call sends back, from 1 to
	// MaxRequeueLimit; 0 means MaxRequeueLimit.
	Limit int
	// After continues a pass over the dead-letter topic: the Next of the
	// previous call's RequeueResult, passed back as it is. Empty starts a
	// pass, which covers the dead letters present at that moment; letters
	// appended later (a requeued message that failed again) belong to the
	// next pass, so a pass always ends.
	After string
}

// Validate reports a filter that RequeueDeadLetters refuses, with an error
// wrapping ErrInvalidFilter, so that a caller decoding a request can refuse
// it before doing anything else.
func (f RequeueFilter) Validate() error {
	switch {
	case f.All && len(f.EventIDs) > 0:
		return fmt.Errorf("%w: All and EventIDs exclude each other", ErrInvalidFilter)
	case !f.All && len(f.EventIDs) == 0 && f.Consumer == "":
		return fmt.Errorf("%w: name the event ids or the consumer to requeue, or set All", ErrInvalidFilter)
	case f.Limit < 0 || f.Limit > MaxRequeueLimit:
		return fmt.Errorf("%w: the limit must be from 1 to %d (0: %d)", ErrInvalidFilter, MaxRequeueLimit, MaxRequeueLimit)
	}
	if _, err := parseRequeueCursor(f.After); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidFilter, err)
	}
	return nil
}

func (f RequeueFilter) sweep() bool { return len(f.EventIDs) == 0 }

func (f RequeueFilter) matches(dl DeadLetter) bool {
	if f.Consumer != "" && dl.Consumer != f.Consumer {
		return false
	}
	if len(f.EventIDs) == 0 {
		return true
	}
	for _, id := range f.EventIDs {
		if id == dl.EventID && id != uuid.Nil {
			return true
		}
	}
	return false
}

// RequeueResult is what one RequeueDeadLetters call did.
type RequeueResult struct {
	// Requeued is how many dead letters the call sent back.
	Requeued int
	// Next is the cursor to pass as RequeueFilter.After to go on with the
	// pass; empty when the pass has read every dead letter it covers. A call
	// that stops at its Limit, or after reading requeueScanLimit letters,
	// returns a Next even when it requeued nothing.
	Next string
	// Refused lists the matching dead letters the call did not send, and
	// why; it changed nothing for them. A requeue sends an event whole or
	// not at all: a letter the dead-letter topic holds only truncated
	// (HeaderDLTTruncated) is sent from the original the inbox kept, and
	// refused when there is none; a message that does not decode as an
	// event is refused, since its consumer could only dead-letter it again.
	// Their aggregates stay held: ReleaseHeld or SkipHeld is the way out.
	Refused []RefusedLetter
}

// RefusedLetter is a dead letter RequeueDeadLetters did not send.
type RefusedLetter struct {
	DeadLetter
	Reason string
}

// partitionRange is the part of one partition of a dead-letter topic that a
// pass still has to read: offsets next up to (not including) end.
type partitionRange struct {
	partition int
	next, end int64
}

// requeueCursor is the text form of a pass's remaining ranges, in partition
// order: "partition:next:end" joined by commas, e.g. "0:1000:2500,1:0:800".
// It names positions in the dead-letter topic, the only order its letters
// have; a partition left out is done.
type requeueCursor []partitionRange

func (c requeueCursor) String() string {
	parts := make([]string, len(c))
	for i, r := range c {
		parts[i] = fmt.Sprintf("%d:%d:%d", r.partition, r.next, r.end)
	}
	return strings.Join(parts, ",")
}

// maxCursorPartitions bounds the ranges a cursor may name, far above any
// real topic's partition count.
const maxCursorPartitions = 10_000

func parseRequeueCursor(s string) (requeueCursor, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxCursorPartitions {
		return nil, fmt.Errorf("the cursor names more than %d partitions", maxCursorPartitions)
	}
	c := make(requeueCursor, len(parts))
	for i, part := range parts {
		fields := strings.Split(part, ":")
		if len(fields) != 3 {
			return nil, errors.New("the cursor is not one returned as next")
		}
		p, err1 := strconv.Atoi(fields[0])
		next, err2 := strconv.ParseInt(fields[1], 10, 64)
		end, err3 := strconv.ParseInt(fields[2], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil || p < 0 || next < 0 || next >= end ||
			(i > 0 && p <= c[i-1].partition) {
			return nil, errors.New("the cursor is not one returned as next")
		}
		c[i] = partitionRange{partition: p, next: next, end: end}
	}
	return c, nil
}

// requeueChunk bounds how many dead letters one transaction and one
// WriteMessages call handle, and so how many RequeueDeadLetters holds in
// memory.
const requeueChunk = 100

// RequeueDB is what RequeueDeadLetters needs from the caller's database
// handle: *pgxpool.Pool and *pgx.Conn satisfy it.
type RequeueDB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// RequeueDeadLetters sends dead letters of dltTopic that match filter back
// to their original topic, at most filter.Limit of them, oldest first within
// each partition, and returns how many it sent and where the pass goes on.
// Call it again with After set to the returned Next until Next is empty:
//
//	var next string
//	for {
//		res, err := inboxadmin.RequeueDeadLetters(ctx, pool, w, brokers, dlt, inboxadmin.RequeueFilter{All: true, After: next})
//		…
//		if next = res.Next; next == "" {
//			break
//		}
//	}
//
// For each dead letter it marks the dead-lettering consumer's dead_lettered
// inbox row requeued (the transition requeue of pkg/inbox/internal/state; the consumer
// applies the redelivery of a requeued row instead of taking it for a
// duplicate, and in lease mode checks first when its last call may have
// landed) and produces the original message through w: its key, value and
// headers, minus the dlt-* headers — from the original the inbox kept when
// the dead-letter topic took the letter only truncated. The marks of a chunk
// commit only after w took the chunk's messages, so a failed write leaves
// the rows, and the letters pending for the next sweep.
// Fix the cause of the failures before requeuing, or the messages come
// straight back (as new dead letters, for the next pass).
//
// Requeue is at-least-once: a commit that fails after the write leaves the
// rows, so the letters are sent again later, and the inbox absorbs the copy
// (see also RequeueFilter: a filter with EventIDs sends again what was
// requeued before). Consequences worth knowing:
//   - The requeued message reaches every consumer of the original topic, not
//     only the one that gave up; the others absorb it as a duplicate (while
//     their inbox rows are within inbox.PruneConfig.Retention).
//   - Dead letters stay in dltTopic (see ListDeadLetters); a sweep tells the
//     pending ones by their inbox rows.
//   - The message lands where w's balancer puts it: with a writer
//     hashing the key, on its original partition, if the partition count did
//     not change, but after any later events of its aggregate. Those later
//     events were parked by the consumer that dead-lettered it (inbox.Config.
//     DeadKeys), and stay parked until the requeued event is applied; then
//     they are applied in order after it. The requeued event is applied
//     even if the consumer's version guard has moved past it (a consumer
//     that skips ahead): the operator asked for it.
//
// w must not have a Topic of its own: each message names its original topic.
// db must not be a pgx.Tx: each chunk's deletes have to commit on their own,
// right after its write, or the consumers would wait on their row locks. A
// filter that Validate refuses is refused with its error. On error, Requeued
// is what was sent before the failing chunk and Next is empty: call again
// with the same After.
//
// WithDialer connects the reads of dltTopic with a TLS/SASL dialer (w
// carries its own security); the default is plain TCP.
func RequeueDeadLetters(ctx context.Context, db RequeueDB, w Writer, brokers []string, dltTopic string, filter RequeueFilter, opts ...Option) (RequeueResult, error) {
	if err := filter.Validate(); err != nil {
		return RequeueResult{}, err
	}
	if _, ok := db.(pgx.Tx); ok {
		return RequeueResult{}, errors.New("inbox: RequeueDeadLetters needs a pool or a connection, not a transaction: its deletes must commit right after each write")
	}
	limit := cmp.Or(filter.Limit, MaxRequeueLimit)
	dialer := adminDialer(opts)
	partitions, err := dlt.TopicPartitions(ctx, dialer, brokers, dltTopic)
	if err != nil {
		return RequeueResult{}, err
	}
	cursor, _ := parseRequeueCursor(filter.After) // checked by Validate
	if filter.After == "" {
		// A new pass covers what the topic holds now.
		for _, p := range partitions {
			first, last, err := dlt.PartitionOffsets(ctx, dialer, brokers, p)
			if err != nil {
				return RequeueResult{}, err
			}
			if first < last {
				cursor = append(cursor, partitionRange{partition: p.ID, next: first, end: last})
			}
		}
	}

	rq := &requeuer{db: db, w: w, dltTopic: dltTopic, filter: filter}
	for i, pr := range cursor {
		idx, found := slices.BinarySearchFunc(partitions, pr.partition, func(p kafka.Partition, id int) int { return cmp.Compare(p.ID, id) })
		if !found {
			continue // the topic was recreated with fewer partitions: nothing left there
		}
		p := partitions[idx]
		first, last, err := dlt.PartitionOffsets(ctx, dialer, brokers, p)
		if err != nil {
			return RequeueResult{Requeued: rq.total, Refused: rq.refused}, err
		}
		// Retention may have removed letters since the cursor was made, and
		// a recreated topic may hold fewer.
		start, end := max(pr.next, first), min(pr.end, last)
		if start >= end {
			continue
		}
		next := start
		err = dlt.ReadPartition(ctx, dialer, brokers, p, start, end, func(_ int, m kafka.Message) (bool, error) {
			next = m.Offset + 1
			if err := rq.visit(ctx, m, limit); err != nil {
				return false, err
			}
			return rq.total < limit && rq.scanned < requeueScanLimit, nil
		})
		if err == nil {
			err = rq.flush(ctx)
		}
		if err != nil {
			return RequeueResult{Requeued: rq.total, Refused: rq.refused}, err
		}
		if rq.total >= limit || rq.scanned >= requeueScanLimit {
			rest := cursor[i+1:]
			if next < end {
				rest = append(requeueCursor{{partition: pr.partition, next: next, end: end}}, rest...)
			}
			return RequeueResult{Requeued: rq.total, Next: rest.String(), Refused: rq.refused}, nil
		}
	}
	// The pass read the whole topic: what is left are the letters the
	// topic refused even truncated, whose originals the inbox kept.
	if err := rq.fromDatabase(ctx, limit); err != nil {
		return RequeueResult{Requeued: rq.total, Refused: rq.refused}, err
	}
	return RequeueResult{Requeued: rq.total, Refused: rq.refused}, nil
}

// notInTopic reads the kept originals of dead letters dltTopic refused even
// truncated, whose rows are still dead_lettered, as the filter selects them.
const notInTopic = `
SELECT o.consumer, o.message_id, o.topic, o.msg_key, o.msg_value, o.msg_headers
FROM inbox_dead_letter_originals o
JOIN inbox_messages i ON i.consumer = o.consumer AND i.message_id = o.message_id AND i.status = 'dead_lettered'
WHERE NOT o.in_topic AND o.dead_letter_topic = $1 AND ($2 = '' OR o.consumer = $2)
  AND (coalesce(cardinality($3::uuid[]), 0) = 0 OR o.message_id = ANY($3))
ORDER BY o.stored_at
LIMIT $4`

// fromDatabase requeues, once a pass has read the whole topic, the dead
// letters the topic never held (it refused even the truncated record):
// their originals, kept by the inbox, sent as a chunk like any other.
func (rq *requeuer) fromDatabase(ctx context.Context, limit int) error {
	if rq.total >= limit {
		return nil
	}
	tx, err := rq.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: beginning a requeue: %w", err)
	}
	rows, err := tx.Query(ctx, notInTopic, rq.dltTopic, rq.filter.Consumer, rq.filter.EventIDs, limit-rq.total)
	if err != nil {
		_ = tx.Rollback(ctx)
		return fmt.Errorf("inbox: reading the dead letters the topic refused: %w", err)
	}
	var (
		k       deadLetterKey
		m       kafka.Message
		headers []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&k.consumer, &k.id, &m.Topic, &m.Key, &m.Value, &headers}, func() error {
		hs, err := dlt.DecodeHeaders(headers)
		if err != nil {
			return err
		}
		rq.keys = append(rq.keys, k)
		rq.msgs = append(rq.msgs, kafka.Message{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: hs})
		rq.letters = append(rq.letters, DeadLetter{Consumer: k.consumer, EventID: k.id, OriginalTopic: m.Topic,
			OriginalPartition: -1, OriginalOffset: -1})
		rq.truncated = append(rq.truncated, false)
		return nil
	})
	_ = tx.Rollback(ctx)
	if err != nil {
		return fmt.Errorf("inbox: reading the dead letters the topic refused: %w", err)
	}
	return rq.flush(ctx)
}

// deadLetterKey is the inbox row of a dead letter: its consumer and event.
type deadLetterKey struct {
	consumer string
	id       uuid.UUID
}

// requeuer is one RequeueDeadLetters call's state: the chunk it is
// gathering and what it has done so far.
type requeuer struct {
	db       RequeueDB
	w        Writer
	dltTopic string
	filter   RequeueFilter

	scanned, total int
	keys           []deadLetterKey // parallel to msgs; zero for a letter with no row
	msgs           []kafka.Message
	letters        []DeadLetter // parallel to msgs
	truncated      []bool       // parallel to msgs: the topic holds it truncated
	refused        []RefusedLetter
}

// visit adds m to the chunk if it matches, and sends the chunk once it is
// as large as what the call may still requeue (or requeueChunk).
func (rq *requeuer) visit(ctx context.Context, m kafka.Message, limit int) error {
	rq.scanned++
	dl := deadLetterOf(m)
	if !rq.filter.matches(dl) {
		return nil
	}
	var key deadLetterKey
	if dl.EventID != uuid.Nil && dl.Consumer != "" {
		key = deadLetterKey{consumer: dl.Consumer, id: dl.EventID}
	} else if rq.filter.sweep() {
		return nil // no row says whether it is pending: only named ids send it back
	}
	if dl.OriginalTopic == "" {
		return fmt.Errorf("inbox: dead letter %s/%d/%d has no %s header; cannot requeue it",
			rq.dltTopic, m.Partition, m.Offset, dlt.HeaderDLTTopic)
	}
	rq.keys = append(rq.keys, key)
	rq.msgs = append(rq.msgs, originalMessage(dl.OriginalTopic, m))
	rq.letters = append(rq.letters, dl)
	rq.truncated = append(rq.truncated, hasHeader(m, dlt.HeaderDLTTruncated))
	if len(rq.msgs) >= min(requeueChunk, limit-rq.total) {
		return rq.flush(ctx)
	}
	return nil
}

// flush marks the chunk's dead_lettered rows requeued and writes its
// messages in one transaction that commits after the write: a sweep writes
// only the letters whose row it marked. A letter held truncated is sent
// from its kept original; one it cannot send whole, or that does not
// decode, is refused and changes nothing.
func (rq *requeuer) flush(ctx context.Context) error {
	if len(rq.msgs) == 0 {
		return nil
	}
	tx, err := rq.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: beginning a requeue: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if err := rq.wholeOrRefused(ctx, tx); err != nil {
		return err
	}
	if len(rq.msgs) == 0 {
		return nil // every letter of the chunk was refused
	}
	var (
		consumers []string
		ids       []uuid.UUID
	)
	for _, k := range rq.keys {
		if k.id != uuid.Nil {
			consumers, ids = append(consumers, k.consumer), append(ids, k.id)
		}
	}
	deleted := map[deadLetterKey]bool{}
	if len(ids) > 0 {
		rows, err := state.TakeQuery(ctx, tx, &state.Requeue, consumers, ids)
		if err != nil {
			return fmt.Errorf("inbox: marking dead_lettered rows requeued: %w", err)
		}
		var k deadLetterKey
		if _, err := pgx.ForEachRow(rows, []any{&k.consumer, &k.id}, func() error { deleted[k] = true; return nil }); err != nil {
			return fmt.Errorf("inbox: marking dead_lettered rows requeued: %w", err)
		}
		// The aggregates stay held until the requeued messages are applied;
		// then their parked messages are released (settle.go).
		if _, err := state.Take(ctx, tx, &state.RequeueHold, consumers, ids); err != nil {
			return fmt.Errorf("inbox: marking dead aggregates requeued: %w", err)
		}
	}

	send := rq.msgs
	if rq.filter.sweep() {
		send = nil
		for i, k := range rq.keys {
			// A key twice in one chunk (an event dead-lettered, requeued and
			// dead-lettered again) had one row: send it once.
			if deleted[k] {
				send = append(send, rq.msgs[i])
				delete(deleted, k)
			}
		}
	}
	if len(send) > 0 {
		if err := rq.w.WriteMessages(ctx, send...); err != nil {
			return fmt.Errorf("inbox: requeuing %d dead letters of %s: %w", len(send), rq.dltTopic, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: committing the requeue of %d dead letters of %s (written; their rows stay, so a later requeue sends them again): %w",
			len(send), rq.dltTopic, err)
	}
	rq.total += len(send)
	// Fresh slices: w may keep the ones it was given.
	rq.keys, rq.msgs, rq.letters, rq.truncated = nil, nil, nil, nil
	return nil
}

// keptOriginals reads the originals the inbox kept of letters the
// dead-letter topic took only truncated.
const keptOriginals = `
SELECT consumer, message_id, msg_key, msg_value, msg_headers
FROM inbox_dead_letter_originals
WHERE (consumer, message_id) IN (SELECT * FROM unnest($1::text[], $2::uuid[]))`

// wholeOrRefused replaces each truncated letter of the chunk by its kept
// original, and takes out of the chunk (into refused) the letters it cannot
// send whole and those that do not decode as events.
func (rq *requeuer) wholeOrRefused(ctx context.Context, tx pgx.Tx) error {
	var consumers []string
	var ids []uuid.UUID
	for i, k := range rq.keys {
		if rq.truncated[i] && k.id != uuid.Nil {
			consumers, ids = append(consumers, k.consumer), append(ids, k.id)
		}
	}
	kept := map[deadLetterKey]kafka.Message{}
	if len(ids) > 0 {
		rows, err := tx.Query(ctx, keptOriginals, consumers, ids)
		if err != nil {
			return fmt.Errorf("inbox: reading the originals of truncated dead letters: %w", err)
		}
		var (
			k       deadLetterKey
			m       kafka.Message
			headers []byte
		)
		if _, err := pgx.ForEachRow(rows, []any{&k.consumer, &k.id, &m.Key, &m.Value, &headers}, func() error {
			hs, err := dlt.DecodeHeaders(headers)
			if err != nil {
				return err
			}
			kept[k] = kafka.Message{Key: m.Key, Value: m.Value, Headers: hs}
			return nil
		}); err != nil {
			return fmt.Errorf("inbox: reading the originals of truncated dead letters: %w", err)
		}
	}
	n := 0
	for i := range rq.msgs {
		m, reason := rq.msgs[i], ""
		if rq.truncated[i] {
			if orig, ok := kept[rq.keys[i]]; ok {
				m = kafka.Message{Topic: m.Topic, Key: orig.Key, Value: orig.Value, Headers: orig.Headers}
			} else {
				reason = "the dead-letter topic holds it truncated and the inbox kept no original"
			}
		}
		if reason == "" {
			if _, err := event.FromKafka(m); err != nil {
				reason = "it does not decode as an event: " + err.Error()
			}
		}
		if reason != "" {
			rq.refused = append(rq.refused, RefusedLetter{DeadLetter: rq.letters[i], Reason: reason})
			continue
		}
		rq.msgs[n], rq.keys[n], rq.letters[n], rq.truncated[n] = m, rq.keys[i], rq.letters[i], false
		n++
	}
	rq.msgs, rq.keys, rq.letters, rq.truncated = rq.msgs[:n], rq.keys[:n], rq.letters[:n], rq.truncated[:n]
	return nil
}

func hasHeader(m kafka.Message, key string) bool {
	for _, h := range m.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}

// dltHeaderPrefix marks the headers a dead-lettering adds; a requeue strips
// every header with it, including any a later version may add.
const dltHeaderPrefix = "dlt-"

// originalMessage rebuilds the message the consumer read, minus the headers
// the dead-lettering added.
func originalMessage(topic string, dl kafka.Message) kafka.Message {
	m := kafka.Message{Topic: topic, Key: dl.Key, Value: dl.Value}
	for _, h := range dl.Headers {
		if !strings.HasPrefix(h.Key, dltHeaderPrefix) {
			m.Headers = append(m.Headers, h)
		}
	}
	return m
}
