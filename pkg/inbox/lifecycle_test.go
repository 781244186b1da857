package inbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// The lifecycle bugs of issue 29, each forced deterministically through
// Consumer.Handle (the consumer's real path, without a group), against the
// real Postgres and Kafka. The interleaving checker (interleave_test.go)
// finds each of them too when it is put back.

// gateWriter is a dead-letter topic that is slow: its first write waits
// until the test opens the gate (entered says it is waiting), then goes to
// the real topic.
type gateWriter struct {
	inbox.Writer
	once    sync.Once
	entered chan struct{}
	open    chan struct{}
}

func newGateWriter(w inbox.Writer) *gateWriter {
	return &gateWriter{Writer: w, entered: make(chan struct{}), open: make(chan struct{})}
}

func (g *gateWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		select {
		case <-g.open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Writer.WriteMessages(ctx, msgs...)
}

// Bug 2: member A waits on a slow dead-letter topic while member B (a
// second group with the same inbox name, or the partition's next owner)
// applies the same event. A's late dead-letter write must change nothing:
// the processed row stays processed and the key's next version is applied,
// not parked behind an event that was applied. In lease mode A's lease was
// taken over meanwhile (the suspected fourth: a dead-letter write over a
// new holder's row).
func TestALateDeadLetterWriteLeavesAProcessedRowAlone(t *testing.T) {
	t.Parallel()
	inBothModes(t, func(t *testing.T, f *fixture, mode string) {
		dlt := testenv.NewTopic(t, f.Brokers, 1)
		name := "shared-" + mode
		v1, v2 := inboxtesting.NewEvent("order-2", 1), inboxtesting.NewEvent("order-2", 2)
		gate := newGateWriter(f.Writer)
		var a, b *inbox.Consumer
		var err error
		cfg := inboxtesting.FastRetries(name, dlt)
		if mode == "transactional" {
			a, err = inbox.NewConsumer(f.Pool, f.Source(testenv.Name("a")), gate, func(context.Context, pgx.Tx, event.Envelope) error {
				return inbox.Permanent(errors.New("member A's handler refuses it"))
			}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			b, err = inbox.NewConsumer(f.Pool, f.Source(testenv.Name("b")), f.Writer, f.recordEffect, cfg)
		} else {
			refusing := inboxtesting.NewBookingParty()
			refusing.Refuse[v1.EventID.String()] = inbox.Permanent(errors.New("member A's third party refuses it"))
			lcfg := lease.Config{Config: cfg, LeaseTTL: 300 * time.Millisecond}
			a, err = lease.NewConsumer(f.Pool, f.Source(testenv.Name("a")), gate, refusing.Effect(), lcfg)
			if err != nil {
				t.Fatal(err)
			}
			b, err = lease.NewConsumer(f.Pool, f.Source(testenv.Name("b")), f.Writer, inboxtesting.NewBookingParty().Effect(), lcfg)
		}
		if err != nil {
			t.Fatal(err)
		}
		aDone := make(chan error, 1)
		go func() { aDone <- a.Handle(context.Background(), event.ToKafka(f.Topic, v1)) }()
		<-gate.entered // A's dead letter waits on the slow topic
		if mode == "lease" {
			// A's lease expires while it waits: B takes it over.
			testenv.WaitFor(t, 10*time.Second, "A's lease to expire", func() (bool, error) {
				return f.Count(t, `SELECT count(*) FROM inbox_messages WHERE message_id = $1 AND lease_until < now()`, v1.EventID) == 1, nil
			})
		}
		inboxtesting.Handle(t, b, event.ToKafka(f.Topic, v1))
		if s := f.Status(t, name, v1); s != "processed" {
			t.Fatalf("B left v1 %s, want processed", s)
		}
		close(gate.open)
		if err := <-aDone; err != nil {
			t.Fatalf("A: %v", err)
		}
		if s := f.Status(t, name, v1); s != "processed" {
			t.Fatalf("A's late dead-letter write turned B's processed v1 into %s", s)
		}
		if n := f.Count(t, `SELECT count(*) FROM inbox_dead_keys WHERE message_id = $1`, v1.EventID); n != 0 {
			t.Fatalf("A's late dead-letter write holds v1's aggregate (%d inbox_dead_keys rows) though v1 was applied", n)
		}
		inboxtesting.Handle(t, b, event.ToKafka(f.Topic, v2))
		if s := f.Status(t, name, v2); s != "processed" {
			t.Fatalf("v2 is %s, want processed: it was parked behind an event that was applied", s)
		}
	})
}

// Bug 4: a dead letter too large for the dead-letter topic is stored there
// truncated. Its requeue must send the whole original (kept by the inbox),
// never the truncated copy, which does not decode: the event is applied,
// and its aggregate's parked successor after it.
func TestARequeuedTruncatedDeadLetterIsSentWholeAndReleasesItsAggregate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.Name("small-dlt")
	testenv.NewTopicNamed(t, f.Brokers, dlt, 1, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "100000"})
	big := inboxtesting.NewEvent("order-4", 1)
	big.Payload = []byte(`{"pad":"` + strings.Repeat("x", 300_000) + `"}`)
	next := inboxtesting.NewEvent("order-4", 2)
	apply, repair := refusedUntilRepaired(big)
	c, err := inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		return apply(ctx, tx.Exec, ev)
	}, inboxtesting.FastRetries("truncated", dlt))
	if err != nil {
		t.Fatal(err)
	}
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, big))
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, next))
	dl := inboxtesting.LastMessage(t, f.Brokers, dlt)
	if len(dl.Value) >= len(big.Payload) {
		t.Fatalf("the dead letter holds %d bytes; want it truncated (the test's premise)", len(dl.Value))
	}
	if n := f.Count(t, `SELECT count(*) FROM inbox_parked_messages WHERE message_id = $1`, next.EventID); n != 1 {
		t.Fatalf("v2 is not parked behind the dead v1 (%d parked rows)", n)
	}

	repair()
	f.Requeue(t, dlt, 1, big.EventID)
	requeued := inboxtesting.LastMessage(t, f.Brokers, f.Topic)
	if !bytes.Equal(requeued.Value, big.Payload) {
		t.Errorf("the requeue sent %d bytes, want the whole original's %d", len(requeued.Value), len(big.Payload))
	}
	inboxtesting.Handle(t, c, requeued)
	got := f.effectOrder(t, map[uuid.UUID]event.Envelope{big.EventID: big, next.EventID: next})
	if fmt.Sprint(got) != "[order-41 order-42]" {
		t.Fatalf("effects %v after the requeue, want v1 then v2 (big v1 is %s, v2 parked: %d)", got,
			f.Status(t, "truncated", big), f.Count(t, `SELECT count(*) FROM inbox_parked_messages WHERE message_id = $1`, next.EventID))
	}
}

// The suspected first: a dead letter that left the dead-letter topic (its
// retention) before anyone requeued it. The requeue finds nothing, and the
// aggregate's later events stay parked: an operator must still have a way
// out. ReleaseHeld applies them (the consumer picks them up by itself),
// with the reason recorded; the dead event stays dead and visible.
func TestAHeldAggregateWhoseDeadLetterIsGoneIsReleasedByAnOperator(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	gone := testenv.NewTopic(t, f.Brokers, 1) // the dead letters went here, then retention took them
	v1, v2 := inboxtesting.NewEvent("order-6", 1), inboxtesting.NewEvent("order-6", 2)
	apply, _ := refusedUntilRepaired(v1)
	cfg := inboxtesting.FastRetries("released", testenv.NewTopic(t, f.Brokers, 1))
	cfg.LagInterval = 50 * time.Millisecond
	cfg.Metrics = inbox.NewMetrics(f.Registry)
	c, err := inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		return apply(ctx, tx.Exec, ev)
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.Produce(t, event.ToKafka(f.Topic, v1), event.ToKafka(f.Topic, v2))
	running := inboxtesting.RunUntilCleanup(t, c)
	testenv.WaitFor(t, 30*time.Second, "v1 dead and v2 parked", func() (bool, error) {
		return f.Status(t, "released", v1) == "dead_lettered" &&
			f.Count(t, `SELECT count(*) FROM inbox_parked_messages WHERE message_id = $1`, v2.EventID) == 1, running()
	})
	ctx := context.Background()
	res, err := inboxadmin.RequeueDeadLetters(ctx, f.Pool, f.Writer, f.Brokers, gone, inboxadmin.RequeueFilter{EventIDs: []uuid.UUID{v1.EventID}})
	if err != nil || res.Requeued != 0 {
		t.Fatalf("requeue of a letter retention took = %+v, %v; want nothing sent", res, err)
	}
	if _, err := inboxadmin.ReleaseHeld(ctx, f.Pool, inboxadmin.HeldAction{Consumer: "released", AggregateType: "thing", AggregateID: "order-6"}); !errors.Is(err, inboxadmin.ErrInvalidHeldAction) {
		t.Fatalf("a release without a reason = %v, want ErrInvalidHeldAction", err)
	}
	held, err := inboxadmin.ReleaseHeld(ctx, f.Pool, inboxadmin.HeldAction{Consumer: "released", AggregateType: "thing", AggregateID: "order-6",
		Reason: "the dead letter left the DLT before anyone requeued it; v1 was settled by hand", Operator: "alice"})
	if err != nil || len(held.Dead) != 1 || held.Dead[0] != v1.EventID || held.Parked != 1 {
		t.Fatalf("ReleaseHeld = %+v, %v; want v1's hold and one parked event", held, err)
	}
	testenv.WaitFor(t, 30*time.Second, "the consumer to apply the released v2 by itself", func() (bool, error) {
		return f.Status(t, "released", v2) == "processed", running()
	})
	if s := f.Status(t, "released", v1); s != "dead_lettered" {
		t.Fatalf("v1 is %s after the release, want still dead_lettered (visible)", s)
	}
	if _, err := inboxadmin.ReleaseHeld(ctx, f.Pool, inboxadmin.HeldAction{Consumer: "released", AggregateType: "thing", AggregateID: "order-6", Reason: "again"}); !errors.Is(err, inboxadmin.ErrNotHeld) {
		t.Fatalf("a second release = %v, want ErrNotHeld", err)
	}
	if n := f.Count(t, `SELECT count(*) FROM inbox_operator_actions WHERE consumer = 'released' AND action = 'release' AND operator = 'alice'`); n != 1 {
		t.Fatalf("%d recorded releases, want 1", n)
	}
	testenv.WaitFor(t, 10*time.Second, "inbox_operator_actions{action=release} to count it", func() (bool, error) {
		return testenv.LabeledMetricValue(t, f.Registry, "inbox_operator_actions", map[string]string{"action": "release"}) == 1, nil
	})
}

// SkipHeld gives up on the dead event and its parked successors: each is
// recorded skipped with the reason, none is applied (a redelivery is a
// duplicate), and the aggregate's next event is applied at once.
func TestSkipHeldRecordsTheDeadAndParkedEventsSkipped(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	v1, v2, v3 := inboxtesting.NewEvent("order-7", 1), inboxtesting.NewEvent("order-7", 2), inboxtesting.NewEvent("order-7", 3)
	apply, _ := refusedUntilRepaired(v1)
	c, err := inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		return apply(ctx, tx.Exec, ev)
	}, inboxtesting.FastRetries("skipped", dlt))
	if err != nil {
		t.Fatal(err)
	}
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, v1))
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, v2))
	held, err := inboxadmin.SkipHeld(context.Background(), f.Pool, inboxadmin.HeldAction{Consumer: "skipped", AggregateType: "thing",
		AggregateID: "order-7", Reason: "order-7 was cancelled upstream; its events no longer apply"})
	if err != nil || len(held.Dead) != 1 || held.Parked != 1 {
		t.Fatalf("SkipHeld = %+v, %v; want one dead and one parked event", held, err)
	}
	for _, ev := range []event.Envelope{v1, v2} {
		if s := f.Status(t, "skipped", ev); s != "skipped" {
			t.Fatalf("v%d is %s, want skipped", ev.AggregateVersion, s)
		}
	}
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, v2), event.ToKafka(f.Topic, v3))
	if got := f.effectOrder(t, map[uuid.UUID]event.Envelope{v1.EventID: v1, v2.EventID: v2, v3.EventID: v3}); fmt.Sprint(got) != "[order-73]" {
		t.Fatalf("effects %v, want only v3: the skipped events are never applied", got)
	}
	if n := f.Count(t, `SELECT count(*) FROM inbox_parked_messages WHERE consumer = 'skipped'`) +
		f.Count(t, `SELECT count(*) FROM inbox_dead_keys WHERE consumer = 'skipped'`); n != 0 {
		t.Fatalf("%d parked messages and holds left, want none", n)
	}
}

// Nothing vanishes or jumps ahead by default (DESIGN.md invariant 12).
// A later version over a missing earlier one waits a bounded time, then is
// dead-lettered, and its successors park behind it; the missing one, when
// it comes, is applied, and the requeued one after it. An older event that
// arrives after a newer one was applied is dead-lettered with its reason,
// holding nothing back; its requeue applies it.
func TestByDefaultAGapIsWaitedForThenParksAndAStaleEventIsDeadLettered(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	cfg := inboxtesting.FastRetries("defaults", dlt)
	cfg.MaxAttempts = 3
	c, err := inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, f.recordEffect, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a1, a2, a3, a4 := inboxtesting.NewEvent("gap", 1), inboxtesting.NewEvent("gap", 2), inboxtesting.NewEvent("gap", 3), inboxtesting.NewEvent("gap", 4)
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, a1))
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, a3)) // v2 is missing
	if s := f.Status(t, "defaults", a3); s != "dead_lettered" {
		t.Fatalf("v3 over a missing v2 is %s, want dead_lettered after a bounded wait (it was applied over the gap)", s)
	}
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, a4))
	if n := f.Count(t, `SELECT count(*) FROM inbox_parked_messages WHERE message_id = $1`, a4.EventID); n != 1 {
		t.Fatalf("v4 is not parked behind the dead v3 (%s)", f.Status(t, "defaults", a4))
	}
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, a2)) // the missing one comes after all
	f.Requeue(t, dlt, 1, a3.EventID)
	inboxtesting.Handle(t, c, inboxtesting.LastMessage(t, f.Brokers, f.Topic))
	all := map[uuid.UUID]event.Envelope{a1.EventID: a1, a2.EventID: a2, a3.EventID: a3, a4.EventID: a4}
	if got := fmt.Sprint(f.effectOrder(t, all)); got != "[gap1 gap2 gap3 gap4]" {
		t.Fatalf("effects %s, want gap1 gap2 gap3 gap4", got)
	}

	b1, b2, b3 := inboxtesting.NewEvent("old", 1), inboxtesting.NewEvent("old", 2), inboxtesting.NewEvent("old", 3)
	late := inboxtesting.NewEvent("old", 1) // another event of version 1, after version 2 was applied
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, b1), event.ToKafka(f.Topic, b2))
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, late))
	var reason string
	if err := f.Pool.QueryRow(context.Background(), `SELECT status || ': ' || coalesce(last_error, '') FROM inbox_messages WHERE message_id = $1`,
		late.EventID).Scan(&reason); err != nil || !strings.Contains(reason, "dead_lettered: stale: version 1 arrived after version 2 was applied") {
		t.Fatalf("the late older event is %q (%v), want dead_lettered with its reason", reason, err)
	}
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, b3))
	if s := f.Status(t, "defaults", b3); s != "processed" {
		t.Fatalf("v3 after a stale dead letter is %s, want processed: a stale one holds nothing back", s)
	}
	f.Requeue(t, dlt, 1, late.EventID)
	// In a batch with another event: the fast path meets the requeued row
	// (a stale dead letter holds nothing) and must leave it to the
	// message-by-message path, which applies it.
	inboxtesting.Handle(t, c, inboxtesting.LastMessage(t, f.Brokers, f.Topic), event.ToKafka(f.Topic, inboxtesting.NewEvent("another", 1)))
	if s := f.Status(t, "defaults", late); s != "processed" {
		t.Fatalf("the requeued stale event is %s, want processed: the operator asked for it", s)
	}
}

// A dead-letter topic that refuses even the truncated record (its
// max.message.bytes below the event): the dead letter is in no topic, its
// inbox row and the original the inbox kept are the record, and a requeue
// by event id sends that original whole.
func TestADeadLetterTheTopicRefusedEvenTruncatedIsRequeuedFromTheInbox(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.Name("tiny-dlt")
	testenv.NewTopicNamed(t, f.Brokers, dlt, 1, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "1000"})
	v1, v2 := inboxtesting.NewEvent("order-8", 1), inboxtesting.NewEvent("order-8", 2)
	v1.Payload = []byte(`{"pad":"` + strings.Repeat("y", 5000) + `"}`)
	apply, repair := refusedUntilRepaired(v1)
	c, err := inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		return apply(ctx, tx.Exec, ev)
	}, inboxtesting.FastRetries("refused-dlt", dlt))
	if err != nil {
		t.Fatal(err)
	}
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, v1))
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, v2))
	if s := f.Status(t, "refused-dlt", v1); s != "dead_lettered" {
		t.Fatalf("v1 is %s, want dead_lettered", s)
	}
	repair()
	// A sweep finds it too (the nemesis's end-of-run requeue-all is one):
	// not in the topic, but pending in the inbox.
	res, err := inboxadmin.RequeueDeadLetters(context.Background(), f.Pool, f.Writer, f.Brokers, dlt, inboxadmin.RequeueFilter{All: true})
	if err != nil || res.Requeued != 1 {
		t.Fatalf("a sweep = %+v, %v; want the one letter the topic refused", res, err)
	}
	requeued := inboxtesting.LastMessage(t, f.Brokers, f.Topic)
	if !bytes.Equal(requeued.Value, v1.Payload) {
		t.Fatalf("the requeue sent %d bytes, want the original's %d", len(requeued.Value), len(v1.Payload))
	}
	inboxtesting.Handle(t, c, requeued)
	if got := fmt.Sprint(f.effectOrder(t, map[uuid.UUID]event.Envelope{v1.EventID: v1, v2.EventID: v2})); got != "[order-81 order-82]" {
		t.Fatalf("effects %s after the requeue, want v1 then v2", got)
	}
}

// A worker reapplying a requeued message locks its inbox row (tRecord),
// then its hold (tDropHold). SkipHeld, meanwhile, must take the same order:
// had it locked the holds first, then the rows, the two would deadlock
// (40P01). The worker's two statements are played here by hand, between
// which the operator's skip starts and waits.
func TestSkipHeldWaitsForAWorkerReapplyingAndNeverDeadlocks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	v1 := inboxtesting.NewEvent("order-8", 1)
	apply, _ := refusedUntilRepaired(v1)
	c, err := inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		return apply(ctx, tx.Exec, ev)
	}, inboxtesting.FastRetries("lockorder", dlt))
	if err != nil {
		t.Fatal(err)
	}
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, v1))
	f.Requeue(t, dlt, 1, v1.EventID)
	if s := f.Status(t, "lockorder", v1); s != "requeued" {
		t.Fatalf("v1 is %s, want requeued", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	worker, err := f.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = worker.Rollback(context.Background()) }()
	if _, err := worker.Exec(ctx, `UPDATE inbox_messages SET status = 'processed', processed_at = now()
WHERE consumer = 'lockorder' AND message_id = $1 AND status = 'requeued'`, v1.EventID); err != nil {
		t.Fatal(err)
	}
	skipped := make(chan error, 1)
	go func() {
		_, err := inboxadmin.SkipHeld(ctx, f.Pool, inboxadmin.HeldAction{Consumer: "lockorder", AggregateType: "thing",
			AggregateID: "order-8", Reason: "cancelled upstream"})
		skipped <- err
	}()
	testenv.WaitFor(t, 20*time.Second, "the skip to wait on a lock", func() (bool, error) {
		return f.Count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 1, nil
	})
	if _, err := worker.Exec(ctx, `DELETE FROM inbox_dead_keys WHERE consumer = 'lockorder' AND message_id = $1`, v1.EventID); err != nil {
		t.Fatalf("the worker's tDropHold after the skip started: %v (the skip locks holds before rows)", err)
	}
	if err := worker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-skipped; err != nil && !errors.Is(err, inboxadmin.ErrNotHeld) {
		t.Fatalf("SkipHeld = %v, want ErrNotHeld: the worker applied the message and released its aggregate first", err)
	}
	if s := f.Status(t, "lockorder", v1); s != "processed" {
		t.Fatalf("v1 is %s, want processed (the worker's)", s)
	}
}
