package inboxadmin_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestRequeueDeadLettersByEventID(t *testing.T) {
	t.Parallel()
	s := newDLTScenario(t)
	ctx := context.Background()

	res, err := inboxadmin.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inboxadmin.RequeueFilter{EventIDs: []uuid.UUID{s.b.EventID}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requeued != 1 || res.Next != "" {
		t.Fatalf("requeued %+v, want 1 and the pass done", res)
	}
	got := readAll(t, s.brokers, s.original, 1)
	// The original key, value and headers (x-tenant included), no dlt-* header.
	sameMessage(t, "requeued b", got[0], s.originalB)
	if _, err := event.FromKafka(got[0]); err != nil {
		t.Fatalf("the requeued message is no longer an event: %v", err)
	}
	// b's row is requeued, not gone: its redelivery applies it (and, in
	// lease mode, checks first when its last call may have landed).
	inboxtesting.EqualStrings(t, "inbox rows after requeuing b", inboxtesting.Rows(t, s.pool), inboxtesting.SortedKeys(
		inboxtesting.RowKey("billing", "dead_lettered", s.a.EventID),
		inboxtesting.RowKey("billing", "requeued", s.b.EventID),
		inboxtesting.RowKey("shipping", "dead_lettered", s.a.EventID),
	))
	// The dead-letter topic is append-only: both dead letters are still listed.
	if dls, err := inboxadmin.ListDeadLetters(ctx, s.brokers, s.dlt, 10); err != nil || len(dls) != 2 {
		t.Fatalf("after the requeue the DLT lists %d dead letters (%v), want 2", len(dls), err)
	}

	// Once billing has handled b, requeuing it again by id produces it
	// again (the caller named it), and leaves the processed row that makes
	// billing absorb it as a duplicate.
	if _, err := s.pool.Exec(ctx, `UPDATE inbox_messages SET status = 'processed', processed_at = now()
		WHERE consumer = 'billing' AND message_id = $1 AND status = 'requeued'`, s.b.EventID); err != nil {
		t.Fatal(err)
	}
	if res, err := inboxadmin.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inboxadmin.RequeueFilter{EventIDs: []uuid.UUID{s.b.EventID}}); err != nil || res.Requeued != 1 {
		t.Fatalf("second requeue of b = %+v, %v; want 1, nil", res, err)
	}
	sameMessage(t, "b requeued again", readAll(t, s.brokers, s.original, 2)[1], s.originalB)
	inboxtesting.EqualStrings(t, "inbox rows after requeuing a handled b", inboxtesting.Rows(t, s.pool), inboxtesting.SortedKeys(
		inboxtesting.RowKey("billing", "dead_lettered", s.a.EventID),
		inboxtesting.RowKey("billing", "processed", s.b.EventID),
		inboxtesting.RowKey("shipping", "dead_lettered", s.a.EventID),
	))
}

func TestRequeueDeadLettersByConsumerAndAll(t *testing.T) {
	t.Parallel()
	s := newDLTScenario(t)
	ctx := context.Background()

	if res, err := inboxadmin.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inboxadmin.RequeueFilter{Consumer: "nobody"}); err != nil || !reflect.DeepEqual(res, inboxadmin.RequeueResult{}) {
		t.Fatalf("requeue of an unknown consumer = %+v, %v; want 0, nil", res, err)
	}
	res, err := inboxadmin.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inboxadmin.RequeueFilter{Consumer: "billing", All: true})
	if err != nil || !reflect.DeepEqual(res, inboxadmin.RequeueResult{Requeued: 2}) {
		t.Fatalf("requeue all of billing = %+v, %v; want 2, nil", res, err)
	}
	got := readAll(t, s.brokers, s.original, 2)
	sameMessage(t, "first requeued", got[0], s.originalA)
	sameMessage(t, "second requeued", got[1], s.originalB)
	// Only billing's rows are requeued; shipping's dead letter of a is its
	// own business.
	inboxtesting.EqualStrings(t, "inbox rows after requeuing billing's", inboxtesting.Rows(t, s.pool), inboxtesting.SortedKeys(
		inboxtesting.RowKey("billing", "requeued", s.a.EventID),
		inboxtesting.RowKey("billing", "requeued", s.b.EventID),
		inboxtesting.RowKey("shipping", "dead_lettered", s.a.EventID)))
	// Both dead letters are still in the topic, but no longer pending.
	if res, err := inboxadmin.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inboxadmin.RequeueFilter{All: true}); err != nil || !reflect.DeepEqual(res, inboxadmin.RequeueResult{}) {
		t.Fatalf("a second sweep = %+v, %v; want nothing left", res, err)
	}
	readAll(t, s.brokers, s.original, 2)
}

// A sweep of every dead letter is bounded per call and resumable: 2,500
// dead letters over two partitions go back in three calls that follow the
// cursor, each exactly once; a letter appended during the pass waits for the
// next pass, and then nothing is left.
func TestRequeueSweepIsBoundedAndFollowsTheCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxtest.NewDatabase(t)
	brokers := testenv.KafkaBrokers(t)
	original := testenv.NewTopic(t, brokers, 1)
	dlt := original + ".dlt"
	testenv.NewTopicNamed(t, brokers, dlt, 2)
	w := testenv.NewWriter(brokers, 500)
	t.Cleanup(func() { w.Close() })

	const total = 2500
	failedAt := time.Now().UTC()
	evs := make([]event.Envelope, total)
	ids := make([]uuid.UUID, total)
	letters := make([]kafka.Message, 0, total+1)
	for i := range evs {
		evs[i] = sampleEvent(fmt.Sprint("order-", i))
		ids[i] = evs[i].EventID
		letters = append(letters, asDeadLetter(dlt, event.ToKafka(original, evs[i]), "billing", "downstream down", int64(i), failedAt))
	}
	// Event 0 dead-lettered a second time (requeued, failed again): one
	// row, two letters, sent once.
	letters = append(letters, letters[0])
	// A message that was not an event: no row tracks it, so a sweep passes
	// it over.
	letters = append(letters, asDeadLetter(dlt, kafka.Message{Topic: original, Key: []byte("k"), Value: []byte("not an event")},
		"billing", "undecodable", total, failedAt))
	if err := w.WriteMessages(ctx, letters...); err != nil {
		t.Fatalf("producing the dead letters: %v", err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
		                            topic, kafka_partition, kafka_offset, status, last_error, payload_hash)
		SELECT 'billing', id, 'ThingHappened', 'agg', 1, $2, 0, n - 1, 'dead_lettered', 'downstream down', '\x00'
		FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n)`, ids, original); err != nil {
		t.Fatalf("seeding the dead_lettered rows: %v", err)
	}

	var (
		next   string
		calls  []inboxadmin.RequeueResult
		lateID uuid.UUID
	)
	for len(calls) < 5 {
		res, err := inboxadmin.RequeueDeadLetters(ctx, pool, w, brokers, dlt, inboxadmin.RequeueFilter{All: true, After: next})
		if err != nil {
			t.Fatalf("call %d (after %q): %v", len(calls)+1, next, err)
		}
		calls = append(calls, res)
		if next = res.Next; next == "" {
			break
		}
		if len(calls) == 1 {
			// Dead-lettered after the pass began: the next pass's business.
			late := sampleEvent("order-late")
			lateID = late.EventID
			if err := w.WriteMessages(ctx, asDeadLetter(dlt, event.ToKafka(original, late), "billing", "late", total+1, failedAt)); err != nil {
				t.Fatal(err)
			}
			inboxtesting.SeedRows(t, pool, inboxtesting.NewRow("billing", late.EventID, "dead_lettered", 0))
		}
	}
	if len(calls) != 3 || calls[0].Requeued != 1000 || calls[1].Requeued != 1000 || calls[2].Requeued != 500 ||
		calls[0].Next == "" || calls[1].Next == "" {
		t.Fatalf("calls = %+v, want 1000, 1000 and 500 requeued, the first two with a cursor", calls)
	}
	seen := map[uuid.UUID]int{}
	for i, m := range readAll(t, brokers, original, total) {
		ev, err := event.FromKafka(m)
		if err != nil {
			t.Fatalf("requeued message %d is not an event: %v", i, err)
		}
		if seen[ev.EventID]++; seen[ev.EventID] > 1 {
			t.Fatalf("event %s requeued twice", ev.EventID)
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("event %s requeued %d times, want once", id, seen[id])
		}
	}
	inboxtesting.EqualStrings(t, "dead_lettered inbox rows left after the pass", testenv.QueryColumn[string](t, pool,
		`SELECT consumer || ' ' || status || ' ' || message_id FROM inbox_messages WHERE status = 'dead_lettered' ORDER BY 1`),
		[]string{inboxtesting.RowKey("billing", "dead_lettered", lateID)})

	// The next pass reads every letter again and finds only the late one
	// pending; the one after finds nothing left.
	res, err := inboxadmin.RequeueDeadLetters(ctx, pool, w, brokers, dlt, inboxadmin.RequeueFilter{All: true})
	if err != nil || !reflect.DeepEqual(res, inboxadmin.RequeueResult{Requeued: 1}) {
		t.Fatalf("second pass = %+v, %v; want the late letter requeued and the pass done", res, err)
	}
	if ev, err := event.FromKafka(readAll(t, brokers, original, total+1)[total]); err != nil || ev.EventID != lateID {
		t.Fatalf("the second pass requeued %v (%v), want the late event %s", ev.EventID, err, lateID)
	}
	res, err = inboxadmin.RequeueDeadLetters(ctx, pool, w, brokers, dlt, inboxadmin.RequeueFilter{All: true})
	if err != nil || !reflect.DeepEqual(res, inboxadmin.RequeueResult{}) {
		t.Fatalf("third pass = %+v, %v; want nothing left", res, err)
	}
	readAll(t, brokers, original, total+1)
	if n := len(testenv.QueryColumn[string](t, pool, `SELECT message_id::text FROM inbox_messages WHERE status <> 'requeued'`)); n != 0 {
		t.Fatalf("%d inbox rows left that are not requeued, want none", n)
	}
}

// Named event ids are bounded per call the same way, and the cursor carries
// the pass on where the previous call stopped.
func TestRequeueByEventIDFollowsTheCursor(t *testing.T) {
	t.Parallel()
	s := newDLTScenario(t)
	ctx := context.Background()
	filter := inboxadmin.RequeueFilter{EventIDs: []uuid.UUID{s.a.EventID, s.b.EventID}, Limit: 1}
	res, err := inboxadmin.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, filter)
	if err != nil || !reflect.DeepEqual(res, inboxadmin.RequeueResult{Requeued: 1, Next: "0:1:2"}) {
		t.Fatalf("first call = %+v, %v; want a requeued and the cursor 0:1:2", res, err)
	}
	sameMessage(t, "first call", readAll(t, s.brokers, s.original, 1)[0], s.originalA)
	filter.After = res.Next
	if res, err = inboxadmin.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, filter); err != nil || !reflect.DeepEqual(res, inboxadmin.RequeueResult{Requeued: 1}) {
		t.Fatalf("second call = %+v, %v; want b requeued and the pass done", res, err)
	}
	sameMessage(t, "second call", readAll(t, s.brokers, s.original, 2)[1], s.originalB)
}

// failingWriter is a broker that refuses every write.
type failingWriter struct{ calls int }

func (w *failingWriter) WriteMessages(context.Context, ...kafka.Message) error {
	w.calls++
	return errors.New("broker unreachable")
}

func TestRequeueKeepsTheRowsOfAFailedWrite(t *testing.T) {
	t.Parallel()
	s := newDLTScenario(t)
	ctx := context.Background()

	for _, filter := range []inboxadmin.RequeueFilter{{EventIDs: []uuid.UUID{s.a.EventID}}, {All: true}} {
		fw := &failingWriter{}
		res, err := inboxadmin.RequeueDeadLetters(ctx, s.pool, fw, s.brokers, s.dlt, filter)
		if err == nil || !strings.Contains(err.Error(), "broker unreachable") || !reflect.DeepEqual(res, inboxadmin.RequeueResult{}) || fw.calls != 1 {
			t.Fatalf("requeue %+v through a failing writer = %+v, %v after %d writes; want 0 and its error after 1", filter, res, err, fw.calls)
		}
		// The deletes rolled back with the failed write: the letters are
		// still pending, for the retry below and for any later sweep.
		if rows := inboxtesting.Rows(t, s.pool); len(rows) != 3 {
			t.Fatalf("inbox rows after a failed requeue = %q, want the 3 seeded", rows)
		}
	}
	readAll(t, s.brokers, s.original, 0)

	if res, err := inboxadmin.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inboxadmin.RequeueFilter{All: true}); err != nil || res.Requeued != 2 {
		t.Fatalf("retried requeue = %+v, %v; want 2, nil", res, err)
	}
	got := readAll(t, s.brokers, s.original, 2)
	sameMessage(t, "requeued a", got[0], s.originalA)
	sameMessage(t, "requeued b", got[1], s.originalB)
}

func TestRequeueRefusesAnUnsafeCall(t *testing.T) {
	t.Parallel()
	s := newDLTScenario(t)
	ctx := context.Background()
	for _, f := range []inboxadmin.RequeueFilter{
		{},
		{All: true, EventIDs: []uuid.UUID{s.a.EventID}},
		{All: true, Limit: -1},
		{All: true, Limit: inboxadmin.MaxRequeueLimit + 1},
		{All: true, After: "garbage"},
		{All: true, After: "0:5:5"},
		{All: true, After: "1:0:5,0:0:5"},
	} {
		res, err := inboxadmin.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, f)
		if !errors.Is(err, inboxadmin.ErrInvalidFilter) || !reflect.DeepEqual(res, inboxadmin.RequeueResult{}) {
			t.Fatalf("filter %+v: %+v, %v; want nothing and an error wrapping ErrInvalidFilter", f, res, err)
		}
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // test cleanup
	if res, err := inboxadmin.RequeueDeadLetters(ctx, tx, s.writer, s.brokers, s.dlt, inboxadmin.RequeueFilter{All: true}); err == nil || res.Requeued != 0 {
		t.Fatalf("requeue in a transaction = %+v, %v; want it refused", res, err)
	}
	if rows := inboxtesting.Rows(t, s.pool); len(rows) != 3 {
		t.Fatalf("a refused requeue changed the inbox: %q", rows)
	}
	readAll(t, s.brokers, s.original, 0)
}
