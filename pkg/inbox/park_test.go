package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// effectOrder returns the aggregate ids and versions of the effects table
// in the order they were applied, e.g. "a1 a2 b1".
func (f *fixture) effectOrder(t *testing.T, evs map[uuid.UUID]event.Envelope) []string {
	t.Helper()
	rows, err := f.Pool.Query(context.Background(), "SELECT event_id FROM effects ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ev := evs[id]
		out = append(out, fmt.Sprintf("%s%d", ev.AggregateID, ev.AggregateVersion))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// refusedUntilRepaired applies every event as insertEffect does, except
// dead, which it refuses as permanent until repair is called: the handler
// bug that an operator fixes before requeueing dead's dead letter.
func refusedUntilRepaired(dead event.Envelope) (apply execApply, repair func()) {
	var broken atomic.Bool
	broken.Store(true)
	return func(ctx context.Context, exec func(context.Context, string, ...any) (pgconn.CommandTag, error), ev event.Envelope) error {
		if ev.EventID == dead.EventID && broken.Load() {
			return inbox.Permanent(errors.New("refused for now"))
		}
		return insertEffect(ctx, exec, ev)
	}, func() { broken.Store(false) }
}

// While v1 of key a is dead, a's later versions are parked, not applied,
// and key b moves on; the parked messages are counted and listed; the
// requeue of v1 applies v1, then the parked ones in order. In both modes.
func TestAKeyWhoseEarlierVersionIsDeadIsParkedUntilItsRequeue(t *testing.T) {
	t.Parallel()
	inBothModes(t, func(t *testing.T, f *fixture, mode string) {
		dlt := testenv.NewTopic(t, f.Brokers, 1)
		a1, a2, a3, b1, b2 := inboxtesting.NewEvent("a", 1), inboxtesting.NewEvent("a", 2), inboxtesting.NewEvent("a", 3), inboxtesting.NewEvent("b", 1), inboxtesting.NewEvent("b", 2)
		all := map[uuid.UUID]event.Envelope{}
		var msgs []kafka.Message
		for _, ev := range []event.Envelope{a1, a2, b1, a3, b2} {
			all[ev.EventID] = ev
			msgs = append(msgs, event.ToKafka(f.Topic, ev))
		}
		apply, repair := refusedUntilRepaired(a1)
		cfg := inbox.Config{Name: "park-" + mode, DeadLetterTopic: dlt, Metrics: inbox.NewMetrics(f.Registry),
			LagInterval: 50 * time.Millisecond}
		inboxtesting.RunUntilCleanup(t, f.modeConsumer(t, mode, f.Pool, testenv.Name("group"), apply, cfg))
		f.Produce(t, msgs...)

		testenv.WaitFor(t, 30*time.Second, "key b applied past key a's dead v1", func() (bool, error) {
			return f.Count(t, "SELECT count(*) FROM effects WHERE aggregate_id = 'b'") == 2, nil
		})
		testenv.WaitFor(t, 30*time.Second, "a2 and a3 parked", func() (bool, error) {
			rep, err := inboxadmin.Backlog(context.Background(), f.Pool, inboxadmin.BacklogConfig{Samples: 10})
			return rep.Parked.Count == 2, err
		})
		if got := f.effectOrder(t, all); len(got) != 2 {
			t.Fatalf("effects %v while a1 is dead, want only b's: a's later versions must be parked", got)
		}
		rep, err := inboxadmin.Backlog(context.Background(), f.Pool, inboxadmin.BacklogConfig{Samples: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Parked.Samples) != 2 || rep.Parked.Samples[0] != a2.EventID || rep.Parked.Samples[1] != a3.EventID {
			t.Fatalf("parked samples %v, want a2 %v then a3 %v", rep.Parked.Samples, a2.EventID, a3.EventID)
		}
		parked, err := inboxadmin.ListParked(context.Background(), f.Pool, inboxadmin.ParkedFilter{Consumer: cfg.Name})
		if err != nil {
			t.Fatal(err)
		}
		if len(parked) != 2 || parked[0].BlockedBy != a1.EventID || parked[0].AggregateVersion != 2 || parked[1].AggregateVersion != 3 {
			t.Fatalf("ListParked = %+v, want a2 and a3 behind a1", parked)
		}
		testenv.WaitFor(t, 10*time.Second, "inbox_parked_messages to count them", func() (bool, error) {
			return testenv.MetricValue(t, f.Registry, "inbox_parked_messages") == 2, nil
		})

		repair()
		f.Requeue(t, dlt, 1, a1.EventID)
		testenv.WaitFor(t, 30*time.Second, "a1, then a2 and a3, applied", func() (bool, error) {
			return f.Count(t, "SELECT count(*) FROM effects") == 5, nil
		})
		got := f.effectOrder(t, all)
		if fmt.Sprint(got[2:]) != "[a1 a2 a3]" {
			t.Fatalf("effects in order %v, want a1 a2 a3 after b's", got)
		}
		// A released message is applied, then taken out of the parking in a
		// statement of its own: the parking empties just after the effects.
		testenv.WaitFor(t, 10*time.Second, "the parking emptied after the requeue", func() (bool, error) {
			rep, err := inboxadmin.Backlog(context.Background(), f.Pool, inboxadmin.BacklogConfig{})
			return rep.Parked.Count == 0, err
		})
		testenv.WaitFor(t, 10*time.Second, "inbox_parked_messages back to 0", func() (bool, error) {
			return testenv.MetricValue(t, f.Registry, "inbox_parked_messages") == 0, nil
		})
	})
}

// A consumer that skips ahead (Config.SkipAheadOfDead) applies
// a dead event's successors at once, parks nothing, and still applies the
// dead event when an operator requeues it, although its version guard has
// moved past it. In both modes.
func TestASkipAheadConsumerAppliesSuccessorsAndTheRequeuedEventOnce(t *testing.T) {
	t.Parallel()
	inBothModes(t, func(t *testing.T, f *fixture, mode string) {
		dlt := testenv.NewTopic(t, f.Brokers, 1)
		a1, a2 := inboxtesting.NewEvent("a", 1), inboxtesting.NewEvent("a", 2)
		all := map[uuid.UUID]event.Envelope{a1.EventID: a1, a2.EventID: a2}
		apply, repair := refusedUntilRepaired(a1)
		cfg := inbox.Config{Name: "skip-" + mode, DeadLetterTopic: dlt, SkipAheadOfDead: true}
		inboxtesting.RunUntilCleanup(t, f.modeConsumer(t, mode, f.Pool, testenv.Name("group"), apply, cfg))
		f.Produce(t, event.ToKafka(f.Topic, a1), event.ToKafka(f.Topic, a2))

		testenv.WaitFor(t, 30*time.Second, "a2 applied past the dead a1", func() (bool, error) {
			return f.Count(t, "SELECT count(*) FROM effects WHERE event_id = $1", a2.EventID) == 1, nil
		})
		if rep, err := inboxadmin.Backlog(context.Background(), f.Pool, inboxadmin.BacklogConfig{}); err != nil || rep.Parked.Count != 0 || rep.DeadLettered.Count != 1 {
			t.Fatalf("backlog %+v (%v), want a1 dead and nothing parked", rep, err)
		}
		repair()
		f.Requeue(t, dlt, 1, a1.EventID)
		testenv.WaitFor(t, 30*time.Second, "the requeued a1 applied", func() (bool, error) {
			return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE message_id = $1 AND status IN ('processed', 'stale')", a1.EventID) == 1, nil
		})
		if got := f.effectOrder(t, all); fmt.Sprint(got) != "[a2 a1]" {
			t.Fatalf("effects %v, want a2 then the requeued a1, once each", got)
		}
	})
}

// The same schedule through Consumer.Handle, so that which messages share a
// batch is fixed: a1 (dead), a2 and b1 in one batch — in lease mode a2 was
// leased with a1 before a1 died —, a3 in a batch of its own; then the
// requeued a1 arrives, alone. In both modes.
func TestParkingWithinABatchAndAcrossBatches(t *testing.T) {
	t.Parallel()
	inBothModes(t, func(t *testing.T, f *fixture, mode string) {
		parkingThroughHandle(t, f, mode, f.Pool)
	})
}

// A runtime role (DML on the inbox's tables, no DDL, as docs/adopt.md and the
// platform's pgroles grant it) parks, releases and requeues: parking needs no
// more than the inbox's other paths.
func TestTheRuntimeRoleParksAndReleases(t *testing.T) {
	t.Parallel()
	inBothModes(t, func(t *testing.T, f *fixture, mode string) {
		parkingThroughHandle(t, f, mode, testenv.NewPool(t, testenv.RuntimeRole(t, f.Pool.Config().ConnString())))
	})
}

// parkingThroughHandle runs the parking schedule through Handle, with the
// consumer's inbox reached through pool.
func parkingThroughHandle(t *testing.T, f *fixture, mode string, pool *pgxpool.Pool) {
	t.Helper()
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	a1, a2, a3, b1 := inboxtesting.NewEvent("a", 1), inboxtesting.NewEvent("a", 2), inboxtesting.NewEvent("a", 3), inboxtesting.NewEvent("b", 1)
	all := map[uuid.UUID]event.Envelope{a1.EventID: a1, a2.EventID: a2, a3.EventID: a3, b1.EventID: b1}
	apply, repair := refusedUntilRepaired(a1)
	c := f.modeConsumer(t, mode, pool, testenv.Name("group"), apply, inbox.Config{Name: "handle-" + mode, DeadLetterTopic: dlt})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg := func(ev event.Envelope, offset int64) kafka.Message {
		m := event.ToKafka(f.Topic, ev)
		m.Topic, m.Offset = f.Topic, offset
		return m
	}
	if err := c.Handle(ctx, msg(a1, 0), msg(a2, 1), msg(b1, 2)); err != nil {
		t.Fatal(err)
	}
	if err := c.Handle(ctx, msg(a3, 3)); err != nil {
		t.Fatal(err)
	}
	if got := f.effectOrder(t, all); fmt.Sprint(got) != "[b1]" {
		t.Fatalf("effects %v while a1 is dead, want [b1]", got)
	}
	parked, err := inboxadmin.ListParked(ctx, f.Pool, inboxadmin.ParkedFilter{})
	if err != nil || len(parked) != 2 || parked[0].EventID != a2.EventID || parked[1].EventID != a3.EventID {
		t.Fatalf("parked %+v (%v), want a2 then a3", parked, err)
	}
	if n := f.Count(t, "SELECT count(*) FROM inbox_messages WHERE message_id = ANY($1)", []uuid.UUID{a2.EventID, a3.EventID}); n != 0 {
		t.Fatalf("%d inbox rows for the parked messages, want none (a lease given up, nothing processed)", n)
	}
	// A redelivery of a parked message is absorbed.
	if err := c.Handle(ctx, msg(a2, 1)); err != nil {
		t.Fatal(err)
	}
	if got := f.effectOrder(t, all); fmt.Sprint(got) != "[b1]" {
		t.Fatalf("effects %v after a parked message came again, want [b1]", got)
	}

	repair()
	if res, err := inboxadmin.RequeueDeadLetters(ctx, pool, f.Writer, f.Brokers, dlt, inboxadmin.RequeueFilter{EventIDs: []uuid.UUID{a1.EventID}}); err != nil || res.Requeued != 1 {
		t.Fatalf("requeue = %+v, %v; want 1 requeued", res, err)
	}
	if err := c.Handle(ctx, msg(a1, 4)); err != nil { // the requeued copy, later in the partition
		t.Fatal(err)
	}
	if got := f.effectOrder(t, all); fmt.Sprint(got) != "[b1 a1 a2 a3]" {
		t.Fatalf("effects %v after the requeue, want [b1 a1 a2 a3]", got)
	}
	if parked, err := inboxadmin.ListParked(ctx, f.Pool, inboxadmin.ParkedFilter{}); err != nil || len(parked) != 0 {
		t.Fatalf("still parked after the requeue: %+v (%v)", parked, err)
	}
	if n := f.Count(t, "SELECT count(*) FROM inbox_dead_keys"); n != 0 {
		t.Fatalf("%d dead aggregates left after the requeue, want none", n)
	}
}

// A consumer that crashed after applying a requeued event, before releasing
// the parked events behind it, leaves them parked with nothing dead ahead.
// The partition's next owner releases them when its generation starts,
// without waiting for another event of the aggregate. In both modes.
func TestParkedEventsLeftWithNothingDeadAheadAreReleasedByTheNextOwner(t *testing.T) {
	t.Parallel()
	inBothModes(t, func(t *testing.T, f *fixture, mode string) {
		name := "orphans-" + mode
		a2, a3 := inboxtesting.NewEvent("a", 2), inboxtesting.NewEvent("a", 3)
		all := map[uuid.UUID]event.Envelope{a2.EventID: a2, a3.EventID: a3}
		for i, ev := range []event.Envelope{a2, a3} {
			m := event.ToKafka(f.Topic, ev)
			type header struct {
				Key   []byte `json:"key"`
				Value []byte `json:"value"`
			}
			var hs []header
			for _, h := range m.Headers {
				hs = append(hs, header{[]byte(h.Key), h.Value})
			}
			headers, err := json.Marshal(hs)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Pool.Exec(context.Background(), `INSERT INTO inbox_parked_messages (consumer, message_id,
				aggregate_type, aggregate_id, aggregate_version, event_type, topic, kafka_partition, kafka_offset,
				msg_key, msg_value, msg_headers) VALUES ($1, $2, 'thing', 'a', $3, 'ThingHappened', $4, 0, $5, $6, $7, $8)`,
				name, ev.EventID, ev.AggregateVersion, f.Topic, i, m.Key, m.Value, headers); err != nil {
				t.Fatal(err)
			}
		}
		inboxtesting.RunUntilCleanup(t, f.modeConsumer(t, mode, f.Pool, testenv.Name("group"), insertEffect, inbox.Config{Name: name}))
		testenv.WaitFor(t, 30*time.Second, "the parked events released", func() (bool, error) {
			return f.Count(t, "SELECT count(*) FROM inbox_parked_messages") == 0 &&
				f.Count(t, "SELECT count(*) FROM effects") == 2, nil
		})
		if got := f.effectOrder(t, all); fmt.Sprint(got) != "[a2 a3]" {
			t.Fatalf("effects %v, want [a2 a3]", got)
		}
	})
}

// A later version died first: v2 reached the consumer before v1 (v1 was
// dead in the producer's outbox and requeued there later, say) and was
// refused, since it needs v1's effect. When v1 then arrives it must be
// applied — it is below the dead message, so nothing holds it — and the
// requeue of v2 then applies v2: a1, then a2. Parking v1 behind v2 would
// leave both waiting for each other (and in lease mode a guard moved back
// to "v2 − 1" would call v1 stale). In both modes.
func TestAnEarlierVersionArrivingAfterALaterDeadOneIsApplied(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"transactional", "lease"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			dlt := testenv.NewTopic(t, f.Brokers, 1)
			a1, a2 := inboxtesting.NewEvent("a", 1), inboxtesting.NewEvent("a", 2)
			all := map[uuid.UUID]event.Envelope{a1.EventID: a1, a2.EventID: a2}
			var a1Applied atomic.Bool
			apply := func(ctx context.Context, exec func(context.Context, string, ...any) (pgconn.CommandTag, error), ev event.Envelope) error {
				if ev.EventID == a2.EventID && !a1Applied.Load() {
					return inbox.Permanent(errors.New("a refund before its capture"))
				}
				if err := insertEffect(ctx, exec, ev); err != nil {
					return err
				}
				if ev.EventID == a1.EventID {
					a1Applied.Store(true)
				}
				return nil
			}
			cfg := inbox.Config{Name: "late-" + mode, DeadLetterTopic: dlt, Metrics: inbox.NewMetrics(f.Registry)}
			inboxtesting.RunUntilCleanup(t, f.modeConsumer(t, mode, f.Pool, testenv.Name("group"), apply, cfg))

			f.Produce(t, event.ToKafka(f.Topic, a2))
			testenv.WaitFor(t, 30*time.Second, "a2 dead-lettered", func() (bool, error) {
				return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE message_id = $1 AND status = 'dead_lettered'", a2.EventID) == 1, nil
			})
			f.Produce(t, event.ToKafka(f.Topic, a1))
			// Settled means processed, dead or parked: in lease mode the row
			// exists as 'leased' before the handler has run.
			testenv.WaitFor(t, 30*time.Second, "a1 settled", func() (bool, error) {
				return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE message_id = $1 AND status <> 'leased'", a1.EventID)+
					f.Count(t, "SELECT count(*) FROM inbox_parked_messages WHERE message_id = $1", a1.EventID) > 0, nil
			})
			var status string
			_ = f.Pool.QueryRow(context.Background(), "SELECT coalesce((SELECT status FROM inbox_messages WHERE message_id = $1), 'parked')", a1.EventID).Scan(&status)
			if !a1Applied.Load() {
				t.Fatalf("a1, below the dead a2, was not applied (it is %s)", status)
			}
			f.Requeue(t, dlt, 1, a2.EventID)
			testenv.WaitFor(t, 30*time.Second, "a1 and a2 applied", func() (bool, error) {
				return f.Count(t, "SELECT count(*) FROM effects") == 2, nil
			})
			if got := fmt.Sprint(f.effectOrder(t, all)); got != "[a1 a2]" {
				t.Fatalf("effects %s, want [a1 a2]", got)
			}
		})
	}
}
