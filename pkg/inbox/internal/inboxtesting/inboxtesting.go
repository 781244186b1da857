// Package inboxtesting is the test fixture the tests of package inbox and
// of its lease mode share: a database with the inbox schema, a topic and
// its dead-letter topic, a consumer run until the test ends, traced events,
// a third party that cannot dedupe. It is imported only by _test.go files
// (an internal package, so no adopter sees it; the adopter's kit is
// inboxtest).
package inboxtesting

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Fixture is a fresh database with the inbox schema and an effects table,
// a fresh topic and its dead-letter topic, and a consumer on them.
type Fixture struct {
	Pool     *pgxpool.Pool
	Brokers  []string
	Topic    string
	Writer   *testenv.Writer
	Registry *prometheus.Registry
	Calls    atomic.Int32 // for a test's handler to count its runs
}

// NewFixture makes a fixture, cleaned up when t ends.
func NewFixture(t *testing.T) *Fixture {
	t.Helper()
	f := &Fixture{Brokers: testenv.KafkaBrokers(t), Registry: prometheus.NewRegistry()}
	f.Pool = inboxtest.NewDatabase(t)
	if _, err := f.Pool.Exec(context.Background(),
		`CREATE TABLE effects (event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, seq bigserial)`); err != nil {
		t.Fatal(err)
	}
	f.Topic = testenv.NewTopic(t, f.Brokers, 1)
	testenv.NewTopicNamed(t, f.Brokers, f.Topic+".dlt", 1) // Run refuses to start without it
	f.Writer = testenv.NewWriter(f.Brokers, 10)
	t.Cleanup(func() { f.Writer.Close() })
	return f
}

// Source is the fixture's topic, read in group.
func (f *Fixture) Source(group string) inbox.GroupConfig {
	return inbox.GroupConfig{Brokers: f.Brokers, Topic: f.Topic, Group: group}
}

// RunUntilCleanup runs c until the test ends, and returns running, which
// reports an error once Run has returned early: Run must return only when its
// context ends, so a WaitFor condition returns running() to fail fast.
func RunUntilCleanup(t *testing.T, c *inbox.Consumer) (running func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() {
		runErr = c.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if runErr != nil {
			t.Errorf("consumer: %v", runErr)
		}
	})
	return func() error {
		select {
		case <-done:
			return fmt.Errorf("Run returned before the test ended: %v", runErr)
		default:
			return nil
		}
	}
}

// Produce writes msgs to the fixture's topic.
func (f *Fixture) Produce(t *testing.T, msgs ...kafka.Message) {
	t.Helper()
	for i := range msgs {
		msgs[i].Topic = f.Topic
	}
	if err := f.Writer.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

// Count runs query, a SELECT count(*), on the fixture's database.
func (f *Fixture) Count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := f.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// NewEvent is a valid event of aggregate aggregateID at version.
func NewEvent(aggregateID string, version int64) event.Envelope {
	return event.Envelope{
		EventID: uuid.New(), EventType: "ThingHappened", EventVersion: 1,
		AggregateType: "thing", AggregateID: aggregateID, AggregateVersion: version,
		OccurredAt: time.Now(), Payload: []byte(`{"n":1}`),
	}
}

// Handle runs msgs through c, failing the test on an error.
func Handle(t *testing.T, c *inbox.Consumer, msgs ...kafka.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Handle(ctx, msgs...); err != nil {
		t.Fatalf("Handle: %v", err)
	}
}

// LastMessage reads the last message of partition 0 of topic: what a
// requeue just produced.
func LastMessage(t *testing.T, brokers []string, topic string) kafka.Message {
	t.Helper()
	conn, err := kafka.DialLeader(context.Background(), "tcp", brokers[0], topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, last, err := conn.ReadOffsets()
	conn.Close()
	if err != nil || last == 0 {
		t.Fatalf("%s: end offset %d, %v; want a message", topic, last, err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond,
		MaxBytes: 4 << 20})
	defer r.Close()
	if err := r.SetOffset(last - 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := r.ReadMessage(ctx)
	if err != nil {
		t.Fatalf("reading the last message of %s: %v", topic, err)
	}
	return m
}

// Status is consumer's inbox row status for ev, "(no row)" if it has none.
func (f *Fixture) Status(t *testing.T, consumer string, ev event.Envelope) string {
	t.Helper()
	var s string
	err := f.Pool.QueryRow(context.Background(), `SELECT status FROM inbox_messages WHERE consumer = $1 AND message_id = $2`,
		consumer, ev.EventID).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "(no row)"
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// FastRetries is a consumer's config that retries within milliseconds.
func FastRetries(name, dlt string) inbox.Config {
	return inbox.Config{Name: name, DeadLetterTopic: dlt, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond}
}

// StartTraced starts a trace test: spans recorded, a Fixture, a traced
// event produced to its topic, and a RunUnder for the handler to record
// what it ran under.
func StartTraced(t *testing.T) (*tracetest.SpanRecorder, *Fixture, event.Envelope, *RunUnder) {
	t.Helper()
	rec := testenv.RecordSpans(t)
	f := NewFixture(t)
	ev := TracedEvent()
	f.Produce(t, event.ToKafka(f.Topic, ev))
	return rec, f, ev, &RunUnder{}
}

// RunUnder records the traceparent each event's handler or side effect ran under.
type RunUnder struct {
	mu sync.Mutex
	m  map[string]string
}

// Add records the traceparent ctx carries as ev's.
func (r *RunUnder) Add(ctx context.Context, ev event.Envelope) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]string{}
	}
	r.m[ev.EventID.String()] = event.TraceparentFromContext(ctx)
}

// Of is the traceparent ev ran under, if it ran.
func (r *RunUnder) Of(ev event.Envelope) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tp, ok := r.m[ev.EventID.String()]
	return tp, ok
}

// Wait waits up to 30 seconds for ev to have run and for done, named what,
// and returns the traceparent ev ran under.
func (r *RunUnder) Wait(t *testing.T, ev event.Envelope, what string, done func() bool) string {
	t.Helper()
	var saw string
	testenv.WaitFor(t, 30*time.Second, what, func() (bool, error) {
		var ok bool
		saw, ok = r.Of(ev)
		return ok && done(), nil
	})
	return saw
}

// CheckOneConsumerSpan waits for a span to end, then checks as
// CheckConsumerSpans does and that ev, run once, had one consumer span.
func CheckOneConsumerSpan(t *testing.T, rec *tracetest.SpanRecorder, topic string, ev event.Envelope, handlerSaw string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the consumer span to end", func() (bool, error) {
		return len(rec.Ended()) > 0, nil
	})
	if spans := CheckConsumerSpans(t, rec, topic, ev, handlerSaw); len(spans) != 1 {
		t.Fatalf("%d consumer spans, want 1", len(spans))
	}
}

// Requeue sends the dead letters of ids in dlt back to their topic, as an
// operator would, and fails the test unless it sent n.
func (f *Fixture) Requeue(t *testing.T, dlt string, n int, ids ...uuid.UUID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := inboxadmin.RequeueDeadLetters(ctx, f.Pool, f.Writer, f.Brokers, dlt, inboxadmin.RequeueFilter{EventIDs: ids})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requeued != n {
		t.Fatalf("requeued %d dead letters, want %d", res.Requeued, n)
	}
}

// The producer's context, as the message's traceparent header carries it.
const (
	producerTraceID = testenv.CallerTraceID
	producerSpanID  = testenv.CallerSpanID
)

// TracedEvent is an event whose Kafka header carries a producer's context.
func TracedEvent() event.Envelope {
	ev := NewEvent("agg", 1)
	ev.Traceparent = testenv.CallerTraceparent
	return ev
}

// CheckConsumerSpans checks that every consumer span of ev continues the
// producer's context from the header, that the handler's last run was under
// one of them, and returns them (one per run of the handler).
func CheckConsumerSpans(t *testing.T, rec *tracetest.SpanRecorder, topic string, ev event.Envelope, handlerSaw string) []sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	sawIt := false
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer || s.Name() != "process "+topic {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key != "messaging.message.id" || a.Value.AsString() != ev.EventID.String() {
				continue
			}
			found = append(found, s)
			if p := s.Parent(); p.TraceID().String() != producerTraceID || p.SpanID().String() != producerSpanID || !p.IsRemote() {
				t.Fatalf("a consumer span's parent is %v, want the producer's span from the header", p)
			}
			sawIt = sawIt || handlerSaw == "00-"+producerTraceID+"-"+s.SpanContext().SpanID().String()+"-01"
		}
	}
	if !sawIt {
		t.Fatalf("the handler ran under %q, not under one of the event's %d consumer spans", handlerSaw, len(found))
	}
	return found
}
