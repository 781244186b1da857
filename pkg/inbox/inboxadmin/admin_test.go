package inboxadmin_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

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
	s := &dltScenario{pool: inboxtest.NewDatabase(t), brokers: testenv.KafkaBrokers(t)}
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
	inboxtesting.SeedRows(t, s.pool,
		inboxtesting.NewRow("billing", s.a.EventID, "dead_lettered", time.Minute),
		inboxtesting.NewRow("billing", s.b.EventID, "dead_lettered", time.Minute),
		inboxtesting.NewRow("shipping", s.a.EventID, "dead_lettered", time.Minute),
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
		kafka.Header{Key: inboxadmin.HeaderDLTReason, Value: []byte(reason)},
		kafka.Header{Key: inboxadmin.HeaderDLTConsumer, Value: []byte(consumer)},
		kafka.Header{Key: inboxadmin.HeaderDLTTopic, Value: []byte(m.Topic)},
		kafka.Header{Key: inboxadmin.HeaderDLTPartition, Value: []byte("0")},
		kafka.Header{Key: inboxadmin.HeaderDLTOffset, Value: []byte(strconv.FormatInt(offset, 10))},
		kafka.Header{Key: inboxadmin.HeaderDLTFailedAt, Value: []byte(failedAt.Format(time.RFC3339Nano))},
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
