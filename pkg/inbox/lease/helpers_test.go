package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Helpers copied from pkg/inbox's tests (inbox_test.go, lifecycle_test.go,
// trace_test.go, config_test.go), which the lease tests share with them.

// fixture is a fresh database with the inbox schema and an effects table,
// a fresh topic and its dead-letter topic, and a consumer on them.
type fixture struct {
	pool     *pgxpool.Pool
	brokers  []string
	topic    string
	writer   *testenv.Writer
	registry *prometheus.Registry
	calls    atomic.Int32
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{brokers: testenv.KafkaBrokers(t), registry: prometheus.NewRegistry()}
	f.pool = inboxtest.NewDatabase(t)
	if _, err := f.pool.Exec(context.Background(),
		`CREATE TABLE effects (event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, seq bigserial)`); err != nil {
		t.Fatal(err)
	}
	f.topic = testenv.NewTopic(t, f.brokers, 1)
	testenv.NewTopicNamed(t, f.brokers, f.topic+".dlt", 1) // Run refuses to start without it
	f.writer = testenv.NewWriter(f.brokers, 10)
	t.Cleanup(func() { f.writer.Close() })
	return f
}

// source is the fixture's topic, read in group.
func (f *fixture) source(group string) inbox.GroupConfig {
	return inbox.GroupConfig{Brokers: f.brokers, Topic: f.topic, Group: group}
}

// runUntilCleanup runs c until the test ends, and returns running, which
// reports an error once Run has returned early: Run must return only when its
// context ends, so a WaitFor condition returns running() to fail fast.
func runUntilCleanup(t *testing.T, c *inbox.Consumer) (running func() error) {
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

func (f *fixture) produce(t *testing.T, msgs ...kafka.Message) {
	t.Helper()
	for i := range msgs {
		msgs[i].Topic = f.topic
	}
	if err := f.writer.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func newEvent(aggregateID string, version int64) event.Envelope {
	return event.Envelope{
		EventID: uuid.New(), EventType: "ThingHappened", EventVersion: 1,
		AggregateType: "thing", AggregateID: aggregateID, AggregateVersion: version,
		OccurredAt: time.Now(), Payload: []byte(`{"n":1}`),
	}
}

// handle runs msgs through c, failing the test on an error.
func handle(t *testing.T, c *inbox.Consumer, msgs ...kafka.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Handle(ctx, msgs...); err != nil {
		t.Fatalf("Handle: %v", err)
	}
}

// lastMessage reads the last message of partition 0 of topic: what a
// requeue just produced.
func lastMessage(t *testing.T, brokers []string, topic string) kafka.Message {
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

func (f *fixture) status(t *testing.T, consumer string, ev event.Envelope) string {
	t.Helper()
	var s string
	err := f.pool.QueryRow(context.Background(), `SELECT status FROM inbox_messages WHERE consumer = $1 AND message_id = $2`,
		consumer, ev.EventID).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "(no row)"
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func fastRetries(name, dlt string) inbox.Config {
	return inbox.Config{Name: name, DeadLetterTopic: dlt, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond}
}

// startTraced starts a trace test: spans recorded, a fixture, a traced
// event produced to its topic, and a runUnder for the handler to record
// what it ran under.
func startTraced(t *testing.T) (*tracetest.SpanRecorder, *fixture, event.Envelope, *runUnder) {
	t.Helper()
	rec := testenv.RecordSpans(t)
	f := newFixture(t)
	ev := tracedEvent()
	f.produce(t, event.ToKafka(f.topic, ev))
	return rec, f, ev, &runUnder{}
}

// runUnder records the traceparent each event's handler or side effect ran under.
type runUnder struct {
	mu sync.Mutex
	m  map[string]string
}

func (r *runUnder) add(ctx context.Context, ev event.Envelope) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]string{}
	}
	r.m[ev.EventID.String()] = event.TraceparentFromContext(ctx)
}

func (r *runUnder) of(ev event.Envelope) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tp, ok := r.m[ev.EventID.String()]
	return tp, ok
}

// wait waits up to 30 seconds for ev to have run and for done, named what,
// and returns the traceparent ev ran under.
func (r *runUnder) wait(t *testing.T, ev event.Envelope, what string, done func() bool) string {
	t.Helper()
	var saw string
	testenv.WaitFor(t, 30*time.Second, what, func() (bool, error) {
		var ok bool
		saw, ok = r.of(ev)
		return ok && done(), nil
	})
	return saw
}

// checkOneConsumerSpan waits for a span to end, then checks as
// checkConsumerSpans does and that ev, run once, had one consumer span.
func checkOneConsumerSpan(t *testing.T, rec *tracetest.SpanRecorder, topic string, ev event.Envelope, handlerSaw string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the consumer span to end", func() (bool, error) {
		return len(rec.Ended()) > 0, nil
	})
	if spans := checkConsumerSpans(t, rec, topic, ev, handlerSaw); len(spans) != 1 {
		t.Fatalf("%d consumer spans, want 1", len(spans))
	}
}

// validateCase is a configuration and what its Validate must say: "" for
// valid, else a substring of the error.
type validateCase struct {
	name string
	cfg  interface{ Validate() error }
	want string
}

// checkValidateCases checks each case in a parallel subtest.
func checkValidateCases(t *testing.T, tests []validateCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testenv.CheckErr(t, tt.cfg.Validate(), tt.want)
		})
	}
}

// requeue sends the dead letters of ids in dlt back to their topic, as an
// operator would, and fails the test unless it sent n.
func (f *fixture) requeue(t *testing.T, dlt string, n int, ids ...uuid.UUID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := inboxadmin.RequeueDeadLetters(ctx, f.pool, f.writer, f.brokers, dlt, inboxadmin.RequeueFilter{EventIDs: ids})
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

// tracedEvent is an event whose Kafka header carries a producer's context.
func tracedEvent() event.Envelope {
	ev := newEvent("agg", 1)
	ev.Traceparent = testenv.CallerTraceparent
	return ev
}

// checkConsumerSpans checks that every consumer span of ev continues the
// producer's context from the header, that the handler's last run was under
// one of them, and returns them (one per run of the handler).
func checkConsumerSpans(t *testing.T, rec *tracetest.SpanRecorder, topic string, ev event.Envelope, handlerSaw string) []sdktrace.ReadOnlySpan {
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
