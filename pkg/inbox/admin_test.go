package inbox_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// adminInboxDB returns a pool on a fresh database with the inbox schema.
func adminInboxDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return testenv.NewPool(t, testenv.NewMigratedDatabase(t, testenv.Migration{FS: inbox.Migrations, Table: inbox.MigrationsTable}))
}

// inboxRow is one inbox row of a scenario, as the consumer would have left it.
type inboxRow struct {
	consumer string
	id       uuid.UUID
	status   string        // processed or dead_lettered
	age      time.Duration // processed_at (and received_at) = now() - age
}

func seedInbox(t *testing.T, pool *pgxpool.Pool, rows ...inboxRow) {
	t.Helper()
	for i, r := range rows {
		// Dead-lettered rows get an old processed_at too, so that only the
		// status can keep Prune away from them.
		_, err := pool.Exec(context.Background(), `
			INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
			                            topic, kafka_partition, kafka_offset, status, last_error, payload_hash,
			                            received_at, processed_at)
			VALUES ($1, $2, 'ThingHappened', 'agg', 1, 'things', 0, $3, $4,
			        CASE $4 WHEN 'dead_lettered' THEN 'boom' END, '\x00',
			        now() - $5::bigint * interval '1 microsecond', now() - $5::bigint * interval '1 microsecond')`,
			r.consumer, r.id, i, r.status, r.age.Microseconds())
		if err != nil {
			t.Fatalf("seeding inbox row %d: %v", i, err)
		}
	}
}

// inboxRows lists every inbox row as "consumer status message_id", sorted.
func inboxRows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT consumer || ' ' || status || ' ' || message_id FROM inbox_messages ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{}, got...)
}

func rowKey(consumer, status string, id uuid.UUID) string {
	return consumer + " " + status + " " + id.String()
}

func sortedKeys(keys ...string) []string { slices.Sort(keys); return keys }

func equalStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

const adminDay = 24 * time.Hour

func TestPruneRemovesOnlyProcessedRowsPastRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := adminInboxDB(t)
	ids := make([]uuid.UUID, 8)
	for i := range ids {
		ids[i] = uuid.New()
	}
	seedInbox(t, pool,
		inboxRow{"billing", ids[6], "stale", 31 * adminDay}, // skipped by the version guard, past retention
		inboxRow{"billing", ids[7], "stale", time.Hour},
		inboxRow{"billing", ids[0], "processed", 31 * adminDay},      // past the default 30 days
		inboxRow{"shim", ids[1], "processed", 400 * adminDay},        // long past, another consumer
		inboxRow{"billing", ids[2], "processed", time.Hour},          // recent
		inboxRow{"billing", ids[3], "processed", 29 * adminDay},      // just inside
		inboxRow{"billing", ids[4], "dead_lettered", 400 * adminDay}, // old, but the audit of a dead letter
		inboxRow{"shim", ids[5], "dead_lettered", time.Hour},
	)

	n, err := inbox.Prune(ctx, pool, inbox.PruneConfig{}) // default retention: 30 days
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("Prune removed %d rows, want 3", n)
	}
	equalStrings(t, "left in inbox_messages", inboxRows(t, pool), sortedKeys(
		rowKey("billing", "processed", ids[2]),
		rowKey("billing", "processed", ids[3]),
		rowKey("billing", "dead_lettered", ids[4]),
		rowKey("shim", "dead_lettered", ids[5]),
		rowKey("billing", "stale", ids[7]),
	))

	if n, err := inbox.Prune(ctx, pool, inbox.PruneConfig{Retention: 2 * time.Hour}); err != nil || n != 1 {
		t.Fatalf("Prune with a 2h retention = %d, %v; want the 29-day-old row only", n, err)
	}
	equalStrings(t, "left after a 2h retention", inboxRows(t, pool), sortedKeys(
		rowKey("billing", "processed", ids[2]),
		rowKey("billing", "dead_lettered", ids[4]),
		rowKey("shim", "dead_lettered", ids[5]),
		rowKey("billing", "stale", ids[7]),
	))
}

// batchRecorder is the real pool, recording what each of Prune's statements
// removed and which rows were left after it.
type batchRecorder struct {
	*pgxpool.Pool
	t       *testing.T
	removed []int64
	left    [][]string
}

func (b *batchRecorder) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := b.Pool.Exec(ctx, sql, args...)
	if err == nil {
		b.removed = append(b.removed, tag.RowsAffected())
		b.left = append(b.left, inboxRows(b.t, b.Pool))
	}
	return tag, err
}

func TestPruneWorksInBatchesOldestFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := adminInboxDB(t)
	old := make([]uuid.UUID, 5)
	var rows []inboxRow
	for i := range old {
		old[i] = uuid.New()
		// Later rows are older, so oldest first is not insertion order.
		rows = append(rows, inboxRow{"billing", old[i], "processed", 40*adminDay + time.Duration(i)*time.Hour})
	}
	recent, dead := uuid.New(), uuid.New()
	rows = append(rows,
		inboxRow{"billing", recent, "processed", time.Minute},
		inboxRow{"billing", dead, "dead_lettered", 50 * adminDay},
	)
	seedInbox(t, pool, rows...)

	rec := &batchRecorder{Pool: pool, t: t}
	n, err := inbox.Prune(ctx, rec, inbox.PruneConfig{BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Fatalf("Prune removed %d rows, want 5", n)
	}
	if fmt.Sprint(rec.removed) != "[2 2 1]" {
		t.Fatalf("rows removed per statement = %v, want [2 2 1]", rec.removed)
	}
	keep := []string{rowKey("billing", "processed", recent), rowKey("billing", "dead_lettered", dead)}
	want := [][]string{
		sortedKeys(append(slices.Clone(keep), rowKey("billing", "processed", old[0]), rowKey("billing", "processed", old[1]), rowKey("billing", "processed", old[2]))...),
		sortedKeys(append(slices.Clone(keep), rowKey("billing", "processed", old[0]))...),
		sortedKeys(slices.Clone(keep)...),
	}
	for i := range want {
		equalStrings(t, fmt.Sprintf("left after batch %d", i+1), rec.left[i], want[i])
	}

	rec.removed = nil
	if n, err := inbox.Prune(ctx, rec, inbox.PruneConfig{BatchSize: 2}); err != nil || n != 0 {
		t.Fatalf("second Prune = %d, %v; want 0, nil", n, err)
	}
	if fmt.Sprint(rec.removed) != "[0]" {
		t.Fatalf("second Prune ran statements removing %v, want one removing nothing", rec.removed)
	}
}

func TestPrunerPrunesAtStartAndEveryInterval(t *testing.T) {
	t.Parallel()
	pool := adminInboxDB(t)
	first, second, kept := uuid.New(), uuid.New(), uuid.New()
	seedInbox(t, pool,
		inboxRow{"billing", first, "processed", 31 * adminDay},
		inboxRow{"billing", kept, "dead_lettered", 31 * adminDay},
	)
	logs := &testenv.LogBuffer{}
	pruner, err := inbox.NewPruner(pool, inbox.PrunerConfig{
		Interval: 50 * time.Millisecond,
		Logger:   slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- pruner.Run(ctx) }()

	// The row is gone once the delete commits, a moment before the pruner
	// logs it: wait for both, or a slow machine reads the log too early.
	testenv.WaitFor(t, 10*time.Second, "the first run to prune the old processed row and log it", func() (bool, error) {
		_, logged := logs.Record("inbox pruned processed messages")
		return logged && len(inboxRows(t, pool)) == 1, nil
	})
	rec, ok := logs.Record("inbox pruned processed messages")
	if !ok || rec["rows_removed"] != float64(1) {
		t.Fatalf("first run's log record = %v, want rows_removed 1\n%s", rec, logs.String())
	}
	seedInbox(t, pool, inboxRow{"billing", second, "processed", 60 * adminDay})
	testenv.WaitFor(t, 10*time.Second, "a later run to prune a row added since", func() (bool, error) {
		return len(inboxRows(t, pool)) == 1, nil
	})
	equalStrings(t, "left", inboxRows(t, pool), []string{rowKey("billing", "dead_lettered", kept)})

	stop()
	var runErr error
	testenv.WaitFor(t, 10*time.Second, "Run to return once its context ended", func() (bool, error) {
		select {
		case runErr = <-done:
			return true, nil
		default:
			return false, nil
		}
	})
	if runErr != nil {
		t.Fatalf("Run returned %v, want nil", runErr)
	}
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Fatalf("the pruner logged an error:\n%s", logs.String())
	}
}

func TestNewPrunerNeedsADatabase(t *testing.T) {
	t.Parallel()
	if _, err := inbox.NewPruner(nil, inbox.PrunerConfig{}); err == nil {
		t.Fatal("NewPruner(nil) returned no error")
	}
}

// dltScenario is an original topic and its dead-letter topic holding two
// dead letters of consumer "billing", a and b, whose dead_lettered inbox rows
// exist, next to a dead_lettered row of another consumer for a.
type dltScenario struct {
	pool                 *pgxpool.Pool
	brokers              []string
	original, dlt        string
	writer               *testenv.Writer
	a, b                 event.Envelope
	originalA            kafka.Message // a as the consumer read it
	originalB            kafka.Message
	failedAtA, failedAtB time.Time
}

func newDLTScenario(t *testing.T) *dltScenario {
	t.Helper()
	s := &dltScenario{pool: adminInboxDB(t), brokers: testenv.KafkaBrokers(t)}
	s.original = testenv.NewTopic(t, s.brokers, 1)
	s.dlt = s.original + ".dlt"
	testenv.NewTopicNamed(t, s.brokers, s.dlt, 1)
	s.writer = testenv.NewWriter(s.brokers, 10)
	t.Cleanup(func() { s.writer.Close() })

	s.a, s.b = sampleEvent("order-a"), sampleEvent("order-b")
	s.b.EventType = "PaymentCaptured"
	s.originalA, s.originalB = event.ToKafka(s.original, s.a), event.ToKafka(s.original, s.b)
	// A header the event package does not know must survive a requeue too.
	s.originalB.Headers = append(s.originalB.Headers, kafka.Header{Key: "x-tenant", Value: []byte("acme")})
	s.failedAtA = time.Date(2025, 3, 1, 10, 0, 0, 123456789, time.UTC)
	s.failedAtB = s.failedAtA.Add(time.Minute)

	ctx := context.Background()
	// One write each, so their order in the dead-letter topic is certain.
	for _, m := range []kafka.Message{
		asDeadLetter(s.dlt, s.originalA, "billing", "unknown ThingHappened version 2", 7, s.failedAtA),
		asDeadLetter(s.dlt, s.originalB, "billing", "gave up after 5 attempts: downstream down", 8, s.failedAtB),
	} {
		if err := s.writer.WriteMessages(ctx, m); err != nil {
			t.Fatalf("producing a dead letter: %v", err)
		}
	}
	seedInbox(t, s.pool,
		inboxRow{"billing", s.a.EventID, "dead_lettered", time.Minute},
		inboxRow{"billing", s.b.EventID, "dead_lettered", time.Minute},
		inboxRow{"shipping", s.a.EventID, "dead_lettered", time.Minute},
	)
	return s
}

func sampleEvent(aggregateID string) event.Envelope {
	return event.Envelope{
		EventID: uuid.New(), EventType: "ThingHappened", EventVersion: 1,
		AggregateType: "order", AggregateID: aggregateID, AggregateVersion: 1,
		OccurredAt: time.Now(), Payload: []byte(`{"amount":42,"aggregate":"` + aggregateID + `"}`),
	}
}

// asDeadLetter is what the consumer publishes for a message it gave up on.
func asDeadLetter(dlt string, m kafka.Message, consumer, reason string, offset int64, failedAt time.Time) kafka.Message {
	dl := kafka.Message{Topic: dlt, Key: m.Key, Value: m.Value}
	dl.Headers = append(slices.Clone(m.Headers),
		kafka.Header{Key: inbox.HeaderDLTReason, Value: []byte(reason)},
		kafka.Header{Key: inbox.HeaderDLTConsumer, Value: []byte(consumer)},
		kafka.Header{Key: inbox.HeaderDLTTopic, Value: []byte(m.Topic)},
		kafka.Header{Key: inbox.HeaderDLTPartition, Value: []byte("0")},
		kafka.Header{Key: inbox.HeaderDLTOffset, Value: []byte(strconv.FormatInt(offset, 10))},
		kafka.Header{Key: inbox.HeaderDLTFailedAt, Value: []byte(failedAt.Format(time.RFC3339Nano))},
	)
	return dl
}

// readAll waits until partition 0 of topic holds want messages, checks it
// holds no more, and returns them.
func readAll(t *testing.T, brokers []string, topic string, want int) []kafka.Message {
	t.Helper()
	var last int64
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("%d messages in %s", want, topic), func() (bool, error) {
		conn, err := kafka.DialLeader(context.Background(), "tcp", brokers[0], topic, 0)
		if err != nil {
			return false, err
		}
		defer conn.Close()
		_, last, err = conn.ReadOffsets()
		return err == nil && last >= int64(want), err
	})
	if last != int64(want) {
		t.Fatalf("%s holds %d messages, want %d", topic, last, want)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msgs := make([]kafka.Message, want)
	for i := range msgs {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("reading message %d of %s: %v", i, topic, err)
		}
		msgs[i] = m
	}
	return msgs
}

// sameMessage fails unless got carries want's key, value and exact headers.
func sameMessage(t *testing.T, what string, got, want kafka.Message) {
	t.Helper()
	if string(got.Key) != string(want.Key) || string(got.Value) != string(want.Value) {
		t.Fatalf("%s: key/value %q/%q, want %q/%q", what, got.Key, got.Value, want.Key, want.Value)
	}
	if fmt.Sprint(headerList(got.Headers)) != fmt.Sprint(headerList(want.Headers)) {
		t.Fatalf("%s: headers\n got %v\nwant %v", what, headerList(got.Headers), headerList(want.Headers))
	}
}

func headerList(hs []kafka.Header) []string {
	out := []string{}
	for _, h := range hs {
		out = append(out, h.Key+"="+string(h.Value))
	}
	return out
}

func TestListDeadLettersShowsWhyAndWhereOldestFirst(t *testing.T) {
	t.Parallel()
	s := newDLTScenario(t)
	ctx := context.Background()

	dls, err := inbox.ListDeadLetters(ctx, s.brokers, s.dlt, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 {
		t.Fatalf("listed %d dead letters, want 2: %+v", len(dls), dls)
	}
	want := []inbox.DeadLetter{
		{Partition: 0, Offset: 0, Reason: "unknown ThingHappened version 2", Consumer: "billing",
			OriginalTopic: s.original, OriginalPartition: 0, OriginalOffset: 7, FailedAt: s.failedAtA,
			EventID: s.a.EventID, EventType: "ThingHappened", AggregateID: "order-a",
			KeySize: len("order-a"), ValueSize: len(s.originalA.Value)},
		{Partition: 0, Offset: 1, Reason: "gave up after 5 attempts: downstream down", Consumer: "billing",
			OriginalTopic: s.original, OriginalPartition: 0, OriginalOffset: 8, FailedAt: s.failedAtB,
			EventID: s.b.EventID, EventType: "PaymentCaptured", AggregateID: "order-b",
			KeySize: len("order-b"), ValueSize: len(s.originalB.Value)},
	}
	for i, d := range dls {
		if d.Time.IsZero() || !d.FailedAt.Equal(want[i].FailedAt) {
			t.Fatalf("dead letter %d: time %v, failed at %v; want a time and failed at %v", i, d.Time, d.FailedAt, want[i].FailedAt)
		}
		d.Time, d.FailedAt = time.Time{}, want[i].FailedAt
		if d != want[i] {
			t.Fatalf("dead letter %d:\n got %+v\nwant %+v", i, d, want[i])
		}
	}

	one, err := inbox.ListDeadLetters(ctx, s.brokers, s.dlt, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != 1 || one[0].EventID != s.a.EventID {
		t.Fatalf("limit 1 listed %+v, want only the oldest (a)", one)
	}
	// Listing commits nothing: a second listing sees the same.
	again, err := inbox.ListDeadLetters(ctx, s.brokers, s.dlt, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 2 || again[0].Offset != 0 || again[1].Offset != 1 {
		t.Fatalf("second listing = %+v, want the same two", again)
	}
	// Listing touches neither the inbox nor the original topic.
	if rows := inboxRows(t, s.pool); len(rows) != 3 {
		t.Fatalf("inbox rows after listing = %q, want the 3 seeded", rows)
	}
	readAll(t, s.brokers, s.original, 0)
}

func TestListDeadLettersMergesPartitionsByAppendTime(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	dlt := testenv.NewTopic(t, brokers, 2)
	// A writer that puts each message on the partition it names, with the
	// timestamp it names.
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        dlt,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 2 * time.Millisecond,
		Transport:    &kafka.Transport{MetadataTTL: time.Second},
	}
	defer w.Close()
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	type placed struct {
		partition int
		at        time.Duration
		reason    string
	}
	for _, p := range []placed{{1, 0, "first"}, {0, time.Second, "second"}, {1, 2 * time.Second, "third"}, {0, 3 * time.Second, "fourth"}} {
		m := asDeadLetter(dlt, kafka.Message{Topic: "orig", Key: []byte("k"), Value: []byte("not an event")}, "billing", p.reason, 0, t0)
		m.Topic, m.Partition, m.Time = "", p.partition, t0.Add(p.at)
		if err := w.WriteMessages(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		limit int
		want  string
	}{
		{10, "first@1/0 second@0/0 third@1/1 fourth@0/1"},
		{3, "first@1/0 second@0/0 third@1/1"},
		{1, "first@1/0"},
	} {
		dls, err := inbox.ListDeadLetters(context.Background(), brokers, dlt, tt.limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range dls {
			if d.EventID != uuid.Nil || d.EventType != "" {
				t.Fatalf("a message that is not an event listed with event %v %q", d.EventID, d.EventType)
			}
			got = append(got, fmt.Sprintf("%s@%d/%d", d.Reason, d.Partition, d.Offset))
		}
		if strings.Join(got, " ") != tt.want {
			t.Fatalf("limit %d listed %v, want %s", tt.limit, got, tt.want)
		}
	}
}

func TestListDeadLettersOfAnEmptyOrMissingTopic(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	empty := testenv.NewTopic(t, brokers, 3)
	dls, err := inbox.ListDeadLetters(context.Background(), brokers, empty, 10)
	if err != nil || len(dls) != 0 {
		t.Fatalf("empty topic listed %v, %v; want nothing and no error", dls, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = inbox.ListDeadLetters(ctx, brokers, testenv.Name("missing"), 10)
	if !errors.Is(err, kafka.UnknownTopicOrPartition) {
		t.Fatalf("missing topic: error %v, want one wrapping kafka.UnknownTopicOrPartition", err)
	}
}

func TestRequeueDeadLettersByEventID(t *testing.T) {
	t.Parallel()
	s := newDLTScenario(t)
	ctx := context.Background()

	res, err := inbox.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inbox.RequeueFilter{EventIDs: []uuid.UUID{s.b.EventID}})
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
	equalStrings(t, "inbox rows after requeuing b", inboxRows(t, s.pool), sortedKeys(
		rowKey("billing", "dead_lettered", s.a.EventID),
		rowKey("shipping", "dead_lettered", s.a.EventID),
	))
	// The dead-letter topic is append-only: both dead letters are still listed.
	if dls, err := inbox.ListDeadLetters(ctx, s.brokers, s.dlt, 10); err != nil || len(dls) != 2 {
		t.Fatalf("after the requeue the DLT lists %d dead letters (%v), want 2", len(dls), err)
	}

	// Once billing has handled b, requeuing it again by id produces it
	// again (the caller named it), and leaves the processed row that makes
	// billing absorb it as a duplicate.
	if _, err := s.pool.Exec(ctx, `INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id,
		aggregate_version, topic, kafka_partition, kafka_offset, status, payload_hash, processed_at)
		VALUES ('billing', $1, 'PaymentCaptured', 'order-b', 1, $2, 0, 0, 'processed', '\x00', now())`,
		s.b.EventID, s.original); err != nil {
		t.Fatal(err)
	}
	if res, err := inbox.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inbox.RequeueFilter{EventIDs: []uuid.UUID{s.b.EventID}}); err != nil || res.Requeued != 1 {
		t.Fatalf("second requeue of b = %+v, %v; want 1, nil", res, err)
	}
	sameMessage(t, "b requeued again", readAll(t, s.brokers, s.original, 2)[1], s.originalB)
	equalStrings(t, "inbox rows after requeuing a handled b", inboxRows(t, s.pool), sortedKeys(
		rowKey("billing", "dead_lettered", s.a.EventID),
		rowKey("billing", "processed", s.b.EventID),
		rowKey("shipping", "dead_lettered", s.a.EventID),
	))
}

func TestRequeueDeadLettersByConsumerAndAll(t *testing.T) {
	t.Parallel()
	s := newDLTScenario(t)
	ctx := context.Background()

	if res, err := inbox.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inbox.RequeueFilter{Consumer: "nobody"}); err != nil || res != (inbox.RequeueResult{}) {
		t.Fatalf("requeue of an unknown consumer = %+v, %v; want 0, nil", res, err)
	}
	res, err := inbox.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inbox.RequeueFilter{Consumer: "billing", All: true})
	if err != nil || res != (inbox.RequeueResult{Requeued: 2}) {
		t.Fatalf("requeue all of billing = %+v, %v; want 2, nil", res, err)
	}
	got := readAll(t, s.brokers, s.original, 2)
	sameMessage(t, "first requeued", got[0], s.originalA)
	sameMessage(t, "second requeued", got[1], s.originalB)
	// Only billing's rows go; shipping's dead letter of a is its own business.
	equalStrings(t, "inbox rows after requeuing billing's", inboxRows(t, s.pool),
		[]string{rowKey("shipping", "dead_lettered", s.a.EventID)})
	// Both dead letters are still in the topic, but no longer pending.
	if res, err := inbox.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inbox.RequeueFilter{All: true}); err != nil || res != (inbox.RequeueResult{}) {
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
	pool := adminInboxDB(t)
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
		calls  []inbox.RequeueResult
		lateID uuid.UUID
	)
	for len(calls) < 5 {
		res, err := inbox.RequeueDeadLetters(ctx, pool, w, brokers, dlt, inbox.RequeueFilter{All: true, After: next})
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
			seedInbox(t, pool, inboxRow{"billing", late.EventID, "dead_lettered", 0})
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
	equalStrings(t, "inbox rows left after the pass", inboxRows(t, pool), []string{rowKey("billing", "dead_lettered", lateID)})

	// The next pass reads every letter again and finds only the late one
	// pending; the one after finds nothing left.
	res, err := inbox.RequeueDeadLetters(ctx, pool, w, brokers, dlt, inbox.RequeueFilter{All: true})
	if err != nil || res != (inbox.RequeueResult{Requeued: 1}) {
		t.Fatalf("second pass = %+v, %v; want the late letter requeued and the pass done", res, err)
	}
	if ev, err := event.FromKafka(readAll(t, brokers, original, total+1)[total]); err != nil || ev.EventID != lateID {
		t.Fatalf("the second pass requeued %v (%v), want the late event %s", ev.EventID, err, lateID)
	}
	res, err = inbox.RequeueDeadLetters(ctx, pool, w, brokers, dlt, inbox.RequeueFilter{All: true})
	if err != nil || res != (inbox.RequeueResult{}) {
		t.Fatalf("third pass = %+v, %v; want nothing left", res, err)
	}
	readAll(t, brokers, original, total+1)
	if rows := inboxRows(t, pool); len(rows) != 0 {
		t.Fatalf("inbox rows left: %q, want none", rows)
	}
}

// Named event ids are bounded per call the same way, and the cursor carries
// the pass on where the previous call stopped.
func TestRequeueByEventIDFollowsTheCursor(t *testing.T) {
	t.Parallel()
	s := newDLTScenario(t)
	ctx := context.Background()
	filter := inbox.RequeueFilter{EventIDs: []uuid.UUID{s.a.EventID, s.b.EventID}, Limit: 1}
	res, err := inbox.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, filter)
	if err != nil || res != (inbox.RequeueResult{Requeued: 1, Next: "0:1:2"}) {
		t.Fatalf("first call = %+v, %v; want a requeued and the cursor 0:1:2", res, err)
	}
	sameMessage(t, "first call", readAll(t, s.brokers, s.original, 1)[0], s.originalA)
	filter.After = res.Next
	if res, err = inbox.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, filter); err != nil || res != (inbox.RequeueResult{Requeued: 1}) {
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

	for _, filter := range []inbox.RequeueFilter{{EventIDs: []uuid.UUID{s.a.EventID}}, {All: true}} {
		fw := &failingWriter{}
		res, err := inbox.RequeueDeadLetters(ctx, s.pool, fw, s.brokers, s.dlt, filter)
		if err == nil || !strings.Contains(err.Error(), "broker unreachable") || res != (inbox.RequeueResult{}) || fw.calls != 1 {
			t.Fatalf("requeue %+v through a failing writer = %+v, %v after %d writes; want 0 and its error after 1", filter, res, err, fw.calls)
		}
		// The deletes rolled back with the failed write: the letters are
		// still pending, for the retry below and for any later sweep.
		if rows := inboxRows(t, s.pool); len(rows) != 3 {
			t.Fatalf("inbox rows after a failed requeue = %q, want the 3 seeded", rows)
		}
	}
	readAll(t, s.brokers, s.original, 0)

	if res, err := inbox.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, inbox.RequeueFilter{All: true}); err != nil || res.Requeued != 2 {
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
	for _, f := range []inbox.RequeueFilter{
		{},
		{All: true, EventIDs: []uuid.UUID{s.a.EventID}},
		{All: true, Limit: -1},
		{All: true, Limit: inbox.MaxRequeueLimit + 1},
		{All: true, After: "garbage"},
		{All: true, After: "0:5:5"},
		{All: true, After: "1:0:5,0:0:5"},
	} {
		res, err := inbox.RequeueDeadLetters(ctx, s.pool, s.writer, s.brokers, s.dlt, f)
		if !errors.Is(err, inbox.ErrInvalidFilter) || res != (inbox.RequeueResult{}) {
			t.Fatalf("filter %+v: %+v, %v; want nothing and an error wrapping ErrInvalidFilter", f, res, err)
		}
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // test cleanup
	if res, err := inbox.RequeueDeadLetters(ctx, tx, s.writer, s.brokers, s.dlt, inbox.RequeueFilter{All: true}); err == nil || res.Requeued != 0 {
		t.Fatalf("requeue in a transaction = %+v, %v; want it refused", res, err)
	}
	if rows := inboxRows(t, s.pool); len(rows) != 3 {
		t.Fatalf("a refused requeue changed the inbox: %q", rows)
	}
	readAll(t, s.brokers, s.original, 0)
}

// TestDeadLetterAdminUsesTheGivenDialer points a TLS dialer at the dev
// stack's PLAINTEXT Kafka: listing and requeueing must then fail to connect,
// which shows that WithDialer's dialer (not a plain one built inside) reaches
// every client they open, while the default still reads the topic.
func TestDeadLetterAdminUsesTheGivenDialer(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	dlt := testenv.NewTopic(t, brokers, 2)
	if _, err := inbox.ListDeadLetters(context.Background(), brokers, dlt, 10); err != nil {
		t.Fatalf("listing with the default dialer: %v", err)
	}
	tlsDialer := &kafka.Dialer{Timeout: 3 * time.Second, TLS: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // never verified: the handshake must fail first
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := inbox.ListDeadLetters(ctx, brokers, dlt, 10, inbox.WithDialer(tlsDialer)); err == nil {
		t.Fatal("ListDeadLetters over TLS to a PLAINTEXT broker succeeded: the given dialer was not used")
	}
	w := testenv.NewWriter(brokers, 10)
	defer w.Close()
	_, err := inbox.RequeueDeadLetters(ctx, adminInboxDB(t), w, brokers, dlt, inbox.RequeueFilter{All: true}, inbox.WithDialer(tlsDialer))
	if err == nil {
		t.Fatal("RequeueDeadLetters over TLS to a PLAINTEXT broker succeeded: the given dialer was not used")
	}
	if ctx.Err() != nil {
		t.Fatalf("the TLS attempts took until the deadline instead of failing to connect: %v", err)
	}
}
