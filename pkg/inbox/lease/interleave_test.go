package lease

import (
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/interleave"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// The inbox's interleaving checker (STYLE.md 26): the actors that touch one
// key's rows — two workers across a takeover, the late dead-letter writer,
// an operator's requeue or release, the pruner, a second consumer group
// with the same inbox name — each a sequence of the library's real steps
// (the functions the consumer runs, on the real Postgres and Kafka), every
// interleaving of them run by pkg/internal/interleave, with these
// invariants after each step:
//
//   - the effect at most once: the third party never holds a key twice
//     (a call only when no earlier call may have landed, or after a check
//     said it did not), and a transactional handler's effect row never
//     twice;
//   - a processed row never changes (until the pruner removes it);
//
// and at the end, once every requeued copy was delivered (the redelivery
// Kafka owes): nothing stranded — every event processed, or dead and
// visible (a dead_lettered row), or parked behind a hold whose dead event
// is dead_lettered (requeueable) — and no event skipped as stale that was
// never applied.
//
// Each schedule gets a world of its own: a fresh consumer name (the inbox's
// rows are per consumer) and fresh events, in one database and one pair of
// topics per test. A failure prints the schedule, and
// INTERLEAVE_SCHEDULE='…' replays it alone.

// lab is what a test's worlds share: the database, the topics, a writer.
type lab struct {
	pool    *pgxpool.Pool
	brokers []string
	topic   string
	dlt     string
	w       *testenv.Writer
}

func newLab(t *testing.T, dltConfigs ...kafka.ConfigEntry) *lab {
	t.Helper()
	l := &lab{brokers: testenv.KafkaBrokers(t)}
	l.pool = testenv.NewPool(t, testenv.NewMigratedDatabase(t, testenv.Migration{FS: inbox.Migrations, Table: inbox.MigrationsTable}))
	if _, err := l.pool.Exec(context.Background(), `CREATE TABLE effects (consumer text NOT NULL, event_id uuid NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	l.topic = testenv.NewTopic(t, l.brokers, 1)
	l.dlt = testenv.Name("dlt")
	testenv.NewTopicNamed(t, l.brokers, l.dlt, 1, dltConfigs...)
	l.w = testenv.NewWriter(l.brokers, 10)
	t.Cleanup(func() { l.w.Close() })
	return l
}

// ledger is the third party that cannot dedupe: Call books under the
// idempotency key (refused keys excepted), then fails with failAfter when
// it is set for the key (the booking landed, the answer said otherwise).
type ledger struct {
	mu        sync.Mutex
	booked    map[string]int
	refuse    map[string]bool
	failAfter map[string]bool
}

func newLedger() *ledger {
	return &ledger{booked: map[string]int{}, refuse: map[string]bool{}, failAfter: map[string]bool{}}
}

func (l *ledger) effect() Effect {
	return Effect{
		Check: func(_ context.Context, key string) (bool, error) {
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.booked[key] > 0, nil
		},
		Call: func(_ context.Context, _ event.Envelope, key string) error {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.refuse[key] {
				return engine.Permanent(errors.New("the third party refuses this call"))
			}
			l.booked[key]++
			if l.failAfter[key] {
				return errors.New("502 Bad Gateway (after booking)")
			}
			return nil
		},
	}
}

func (l *ledger) bookings(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.booked[key]
}

// tee writes through to the real topic and keeps what it wrote: the
// requeued copies the final drain delivers. With hold set, a write that
// went through then waits for hold to close (having said so on sent): the
// requeue's transaction stays open after its send, as between its two
// real steps.
type tee struct {
	engine.Writer
	mu   sync.Mutex
	msgs []kafka.Message
	hold chan struct{}
	sent chan struct{}
}

func (t *tee) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if err := t.Writer.WriteMessages(ctx, msgs...); err != nil {
		return err
	}
	t.mu.Lock()
	t.msgs = append(t.msgs, msgs...)
	t.mu.Unlock()
	if t.hold != nil {
		close(t.sent)
		<-t.hold
	}
	return nil
}

func (t *tee) take() []kafka.Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.msgs
	t.msgs = nil
	return out
}

// world is one schedule's state: its consumer name, its events, what it
// saw, and the invariants it checks.
type world struct {
	l        *lab
	name     string
	events   []event.Envelope
	ledger   *ledger            // lease worlds
	pruner   bool               // a pruner may remove processed rows
	copies   tee                // what the world's requeues sent
	drainers []*engine.Consumer // deliver the requeued copies at the end
	seen     map[uuid.UUID]bool // rows seen processed
	stale    map[uuid.UUID]bool // rows seen stale (the pruner may remove them after)
}

func (l *lab) newWorld(evs ...event.Envelope) *world {
	w := &world{l: l, name: testenv.Name("w"), events: evs, seen: map[uuid.UUID]bool{}, stale: map[uuid.UUID]bool{}}
	w.copies.Writer = l.w
	return w
}

func (w *world) msg(ev event.Envelope) kafka.Message {
	m := event.ToKafka(w.l.topic, ev)
	m.Topic, m.Partition = w.l.topic, 0
	return m
}

func (w *world) cfg() engine.Config {
	return engine.Config{Name: w.name, DeadLetterTopic: w.l.dlt, MaxAttempts: 1, BackoffMin: time.Millisecond,
		BackoffMax: 5 * time.Millisecond, Logger: quietLogger()}
}

func (w *world) leaseCfg() Config {
	return Config{Config: w.cfg(), LeaseTTL: 300 * time.Millisecond}
}

// leaseConsumer is a member of a consumer group of its own, with the
// world's inbox name; eff's Check and Call go to the world's ledger.
func (w *world) leaseConsumer(t testing.TB, eff Effect) (*engine.Consumer, *applier) {
	c, err := NewConsumer(w.l.pool, engine.GroupConfig{Brokers: w.l.brokers, Topic: w.l.topic, Group: testenv.Name("g")},
		w.l.w, eff, w.leaseCfg())
	if err != nil {
		t.Fatal(err)
	}
	return c, engine.ApplierOf(c).(*applier)
}

// txConsumer is a transactional member whose handler records the effect,
// unless refuse says no.
func (w *world) txConsumer(t testing.TB, refuse func(event.Envelope) bool) (*engine.Consumer, *engine.TxApplier) {
	c, err := engine.NewConsumer(w.l.pool, engine.GroupConfig{Brokers: w.l.brokers, Topic: w.l.topic, Group: testenv.Name("g")}, w.l.w,
		func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			if refuse != nil && refuse(ev) {
				return engine.Permanent(errors.New("the handler refuses it"))
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, event_id) VALUES ($1, $2)`, w.name, ev.EventID)
			return err
		}, w.cfg())
	if err != nil {
		t.Fatal(err)
	}
	return c, engine.ApplierOf(c).(*engine.TxApplier)
}

func (w *world) requeue(ctx context.Context, ids ...uuid.UUID) error {
	_, err := inboxadmin.RequeueDeadLetters(ctx, w.l.pool, &w.copies, w.l.brokers, w.l.dlt, inboxadmin.RequeueFilter{EventIDs: ids})
	return err
}

// status reads the world's rows: event id -> status.
func (w *world) statuses(ctx context.Context) (map[uuid.UUID]string, error) {
	rows, err := w.l.pool.Query(ctx, `SELECT message_id, status FROM inbox_messages WHERE consumer = $1`, w.name)
	if err != nil {
		return nil, err
	}
	out := map[uuid.UUID]string{}
	var id uuid.UUID
	var s string
	_, err = pgx.ForEachRow(rows, []any{&id, &s}, func() error { out[id] = s; return nil })
	return out, err
}

// check is the invariants after every step.
func (w *world) check(ctx context.Context) error {
	st, err := w.statuses(ctx)
	if err != nil {
		return err
	}
	for id := range w.seen {
		if s, ok := st[id]; (ok && s != state.StatusProcessed) || (!ok && !w.pruner) {
			return fmt.Errorf("event %s was processed and is now %q: a processed row changed", w.label(id), orNone(s))
		}
	}
	for id, s := range st {
		switch s {
		case state.StatusProcessed:
			w.seen[id] = true
		case state.StatusStale:
			w.stale[id] = true
		}
	}
	for _, ev := range w.events {
		if w.ledger != nil {
			if n := w.ledger.bookings(ev.EventID.String()); n > 1 {
				return fmt.Errorf("event %s booked %d times at the third party: the effect happened twice", w.label(ev.EventID), n)
			}
		}
	}
	var twice []string
	rows, err := w.l.pool.Query(ctx, `SELECT event_id FROM effects WHERE consumer = $1 GROUP BY event_id HAVING count(*) > 1`, w.name)
	if err != nil {
		return err
	}
	var id uuid.UUID
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { twice = append(twice, w.label(id)); return nil }); err != nil {
		return err
	}
	if len(twice) > 0 {
		return fmt.Errorf("events %v applied twice", twice)
	}
	return nil
}

// final delivers the requeued copies (the redelivery Kafka owes), then
// checks that nothing is stranded.
func (w *world) final(ctx context.Context) error {
	for _, m := range w.copies.take() {
		for _, c := range w.drainers {
			if err := c.Handle(ctx, m); err != nil {
				return fmt.Errorf("delivering a requeued copy: %w", err)
			}
		}
	}
	// Parked events nothing holds any more go to the consumer, as its
	// periodic resumeReleases hands them over (after an operator's release).
	free, err := w.ids(ctx, `SELECT p.message_id FROM inbox_parked_messages p WHERE p.consumer = $1
		AND NOT EXISTS (SELECT 1 FROM inbox_dead_keys d WHERE d.consumer = p.consumer
		                AND d.aggregate_type = p.aggregate_type AND d.aggregate_id = p.aggregate_id)`)
	if err != nil {
		return err
	}
	for _, id := range free {
		for _, ev := range w.events {
			if ev.EventID == id && len(w.drainers) > 0 {
				if err := w.drainers[0].Handle(ctx, w.msg(ev)); err != nil {
					return fmt.Errorf("releasing a parked event: %w", err)
				}
			}
		}
	}
	if err := w.check(ctx); err != nil {
		return err
	}
	st, err := w.statuses(ctx)
	if err != nil {
		return err
	}
	parked := map[uuid.UUID]bool{}
	parkedIDs, err := w.ids(ctx, `SELECT message_id FROM inbox_parked_messages WHERE consumer = $1`)
	if err != nil {
		return err
	}
	for _, id := range parkedIDs {
		parked[id] = true
	}
	holds, err := w.ids(ctx, `SELECT message_id FROM inbox_dead_keys WHERE consumer = $1`)
	if err != nil {
		return err
	}
	for _, id := range holds {
		if st[id] != state.StatusDead {
			return fmt.Errorf("stranded: the aggregate of %s is held, but its row is %q, not a requeueable dead letter", w.label(id), orNone(st[id]))
		}
	}
	// A stale dead letter (SkipStale false) is right only behind a later
	// version of the same aggregate type that was applied: "dead and
	// visible" is not enough of an end for an event the guard skipped over
	// by mistake.
	staleIDs, err := w.ids(ctx, `SELECT message_id FROM inbox_messages WHERE consumer = $1
		AND status = 'dead_lettered' AND last_error LIKE '%stale: version%'`)
	if err != nil {
		return err
	}
	staleLetters := map[uuid.UUID]bool{}
	for _, id := range staleIDs {
		staleLetters[id] = true
	}
	for _, ev := range w.events {
		s, ok := st[ev.EventID]
		switch {
		case parked[ev.EventID] && len(holds) > 0:
		case parked[ev.EventID]:
			return fmt.Errorf("stranded: %s is parked with nothing dead ahead of it", w.label(ev.EventID))
		case w.stale[ev.EventID] || s == state.StatusStale:
			return fmt.Errorf("%s was skipped as stale by the version guard: never applied", w.label(ev.EventID))
		case !ok && w.seen[ev.EventID]: // pruned after it was processed
		case s == state.StatusDead && staleLetters[ev.EventID] && !w.laterApplied(ev):
			return fmt.Errorf("%s was dead-lettered as stale, but no later version of its %s was applied: "+
				"the version guard stood above an event never applied", w.label(ev.EventID), ev.AggregateType)
		case s == state.StatusProcessed, s == state.StatusDead, s == state.StatusUncertain, s == state.StatusSkipped:
		default:
			return fmt.Errorf("stranded: %s ended %q", w.label(ev.EventID), orNone(s))
		}
	}
	return nil
}

// laterApplied reports whether a later version of ev's aggregate (the same
// type: an order and its payment share the id) was processed.
func (w *world) laterApplied(ev event.Envelope) bool {
	for _, o := range w.events {
		if o.AggregateType == ev.AggregateType && o.AggregateID == ev.AggregateID &&
			o.AggregateVersion > ev.AggregateVersion && w.seen[o.EventID] {
			return true
		}
	}
	return false
}

func (w *world) ids(ctx context.Context, query string) ([]uuid.UUID, error) {
	rows, err := w.l.pool.Query(ctx, query, w.name)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

func (w *world) label(id uuid.UUID) string {
	for _, ev := range w.events {
		if ev.EventID == id {
			return fmt.Sprintf("%s/%s v%d", ev.AggregateType, ev.AggregateID, ev.AggregateVersion)
		}
	}
	return id.String()
}

// quietLogger keeps the thousands of steps' log lines out of the test's
// output; a failure prints its schedule instead.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func orNone(s string) string {
	if s == "" {
		return "(no row)"
	}
	return s
}

func (w *world) interleaveWorld(actors ...interleave.Actor) interleave.World {
	return interleave.World{Actors: actors, Check: w.check, Final: w.final}
}

func step(name string, run func(ctx context.Context) error) interleave.Step {
	return interleave.Step{Name: name, Run: run}
}

func anEvent(typ, id string, v int64) event.Envelope {
	return event.Envelope{EventID: uuid.New(), EventType: "ThingHappened", EventVersion: 1, AggregateType: typ,
		AggregateID: id, AggregateVersion: v, OccurredAt: time.Now(), Payload: []byte(`{"n":1}`)}
}

var exploreOpts = interleave.Options{Exhaustive: 60, Random: 20, BlockAfter: 2 * time.Second}

// A worker leases v1 and calls; the call books, then fails on its last
// allowed attempt, and v1 is dead-lettered. An operator requeues it; the
// redelivery goes to a second worker. The second call must be checked
// first (issue 29, bug 1).
func TestInterleavingsOfARequeueAfterACallThatMayHaveLanded(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	interleave.Explore(t, func(tb testing.TB) interleave.World {
		v1 := anEvent("order", "o1", 1)
		w := l.newWorld(v1)
		w.ledger = newLedger()
		w.ledger.failAfter[v1.EventID.String()] = true
		_, a := w.leaseConsumer(tb, w.ledger.effect())
		c2, a2 := w.leaseConsumer(tb, w.ledger.effect())
		w.drainers = []*engine.Consumer{c2}
		m := w.msg(v1)
		var (
			token    int64
			taken    bool
			out      *engine.Outcome
			requeued = make(chan error, 1)
		)
		return w.interleaveWorld(
			interleave.Actor{Name: "W1", Steps: []interleave.Step{
				step("lease", func(ctx context.Context) error {
					var err error
					ev := v1
					token, out, taken, err = a.lease(ctx, m, &ev)
					var held *leaseHeldError
					if errors.As(err, &held) {
						out = new(engine.Outcome) // another worker holds it: W1 waits (it is redelivered)
						return nil
					}
					return err
				}),
				step("call", func(ctx context.Context) error {
					if out != nil {
						return nil
					}
					// The rest of processLeased: the call (dead-lettered when
					// it fails on its last attempt), then marking it done.
					var counts [engine.NumOutcomes]int
					d := engine.Delivery{Msg: m, Gen: engine.Untracked{}}
					outcome, settled, err := a.underLease(ctx, d, v1, token, taken, time.Time{}, &counts)
					if errors.Is(err, errLeaseLost) {
						return nil
					}
					if err != nil || settled {
						return err
					}
					return a.settleDone(ctx, d, v1, token, outcome)
				}),
			}},
			// The requeue's two steps: it sends the copy, then commits the
			// row's requeued state (a redelivery may come in between, and
			// wait on the row's lock: the explorer runs it blocked).
			interleave.Actor{Name: "Op", Steps: []interleave.Step{
				step("send", func(ctx context.Context) error {
					w.ledger.mu.Lock()
					delete(w.ledger.failAfter, v1.EventID.String()) // the third party answers again
					w.ledger.mu.Unlock()
					w.copies.hold, w.copies.sent = make(chan struct{}), make(chan struct{})
					go func() { requeued <- w.requeue(ctx, v1.EventID) }()
					select {
					case <-w.copies.sent:
						return nil
					case err := <-requeued:
						requeued <- err // nothing to send (no dead letter yet): commit has nothing to wait for
						return nil
					}
				}),
				step("commit", func(context.Context) error {
					close(w.copies.hold)
					return <-requeued
				}),
			}},
			interleave.Actor{Name: "W2", Steps: []interleave.Step{
				step("redelivery", func(ctx context.Context) error {
					for _, cp := range w.copies.take() {
						if err := a2.Process(ctx, []engine.Delivery{{Msg: cp, Gen: engine.Untracked{}}}); err != nil {
							return err
						}
					}
					return nil
				}),
			}},
		)
	}, exploreOpts)
}

// Member A's handler refuses v1 and A dead-letters it, publishing first and
// writing its row after; member B (a second group with the same inbox
// name) applies v1, then v2. A's late row write must change nothing (issue
// 29, bug 2; in lease mode A's lease is taken over by B meanwhile: the
// suspected fourth).
func TestInterleavingsOfALateDeadLetterWriteAndASecondMember(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	t.Run("transactional", func(t *testing.T) {
		interleave.Explore(t, func(tb testing.TB) interleave.World {
			v1, v2 := anEvent("order", "o2", 1), anEvent("order", "o2", 2)
			w := l.newWorld(v1, v2)
			_, a := w.txConsumer(tb, func(event.Envelope) bool { return true })
			b, _ := w.txConsumer(tb, nil)
			w.drainers = []*engine.Consumer{b}
			m := w.msg(v1)
			var (
				due    *engine.DueDeadLetter
				stored engine.DLStored
			)
			return w.interleaveWorld(
				interleave.Actor{Name: "A", Steps: []interleave.Step{
					step("handle", func(ctx context.Context) error {
						tx, err := a.Pool.Begin(ctx)
						if err != nil {
							return err
						}
						defer tx.Rollback(ctx) //nolint:errcheck
						_, err = a.Settle(ctx, tx, m, 1)
						if !errors.As(err, &due) {
							due = nil // a duplicate: B applied it first
							return nil
						}
						return nil
					}),
					step("publish", func(ctx context.Context) error {
						if due == nil {
							return nil
						}
						var err error
						stored, err = a.PublishDeadLetter(ctx, m, due.Ev, due.Reason)
						return err
					}),
					step("record", func(ctx context.Context) error {
						if due == nil {
							return nil
						}
						return pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
							return a.RecordDeadLetter(ctx, tx, m, due.Ev, due.Reason, engine.LeaseRef{}, stored)
						})
					}),
				}},
				interleave.Actor{Name: "B", Steps: []interleave.Step{
					step("v1", func(ctx context.Context) error { return b.Handle(ctx, m) }),
					step("v2", func(ctx context.Context) error { return b.Handle(ctx, w.msg(v2)) }),
				}},
			)
		}, exploreOpts)
	})
	t.Run("lease", func(t *testing.T) {
		interleave.Explore(t, func(tb testing.TB) interleave.World {
			v1, v2 := anEvent("order", "o3", 1), anEvent("order", "o3", 2)
			w := l.newWorld(v1, v2)
			w.ledger = newLedger()
			refusing := w.ledger.effect()
			refusing.Call = func(context.Context, event.Envelope, string) error {
				return engine.Permanent(errors.New("A's third party refuses it"))
			}
			_, a := w.leaseConsumer(tb, refusing)
			b, _ := w.leaseConsumer(tb, w.ledger.effect())
			w.drainers = []*engine.Consumer{b}
			m := w.msg(v1)
			var (
				token  int64
				taken  bool
				skip   bool
				reason error
				stored engine.DLStored
			)
			ev := v1
			return w.interleaveWorld(
				interleave.Actor{Name: "A", Steps: []interleave.Step{
					step("lease", func(ctx context.Context) error {
						var out *engine.Outcome
						var err error
						token, out, taken, err = a.lease(ctx, m, &ev)
						var held *leaseHeldError
						if errors.As(err, &held) || (err == nil && out != nil) {
							skip = true // B holds it, or settled it
							return nil
						}
						return err
					}),
					step("call", func(ctx context.Context) error {
						if skip {
							return nil
						}
						_, _, err := a.runEffect(ctx, engine.Untracked{}, ev, token, time.Time{}, ev.EventID.String(), taken)
						switch {
						case errors.Is(err, errLeaseLost):
							skip = true
							return nil
						case err == nil:
							return errors.New("A's refusing third party took the call")
						}
						reason = err
						return nil
					}),
					step("publish", func(ctx context.Context) error {
						if skip {
							return nil
						}
						var err error
						stored, err = a.PublishDeadLetter(ctx, m, &ev, reason)
						return err
					}),
					step("record", func(ctx context.Context) error {
						if skip {
							return nil
						}
						return pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
							return a.RecordDeadLetter(ctx, tx, m, &ev, reason, engine.LeaseRef{Token: token, MayHaveCalled: true}, stored)
						})
					}),
				}},
				interleave.Actor{Name: "B", Steps: []interleave.Step{
					step("v1", func(ctx context.Context) error { return b.Handle(ctx, m) }),
					step("v2", func(ctx context.Context) error { return b.Handle(ctx, w.msg(v2)) }),
				}},
			)
		}, exploreOpts)
	})
}

// An order and its payment share the aggregate id. The payment's v2 dies
// in lease mode, its v1 arrives late; the order's events and a pruner go
// on beside them. The payment's v1 must be applied (issue 29, bug 3).
func TestInterleavingsOfTwoAggregateTypesSharingAnID(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	interleave.Explore(t, func(tb testing.TB) interleave.World {
		o1, o2 := anEvent("order", "o4", 1), anEvent("order", "o4", 2)
		p1, p2 := anEvent("payment", "o4", 1), anEvent("payment", "o4", 2)
		w := l.newWorld(o1, o2, p1, p2)
		w.ledger = newLedger()
		w.ledger.refuse[p2.EventID.String()] = true
		w.pruner = true
		c, _ := w.leaseConsumer(tb, w.ledger.effect())
		deliver := func(ev event.Envelope) func(context.Context) error {
			return func(ctx context.Context) error { return c.Handle(ctx, w.msg(ev)) }
		}
		return w.interleaveWorld(
			interleave.Actor{Name: "Order", Steps: []interleave.Step{step("v1", deliver(o1)), step("v2", deliver(o2))}},
			interleave.Actor{Name: "Payment", Steps: []interleave.Step{step("v2", deliver(p2)), step("v1", deliver(p1))}},
			interleave.Actor{Name: "engine.Pruner", Steps: []interleave.Step{step("prune", func(ctx context.Context) error {
				_, err := engine.Prune(ctx, l.pool, engine.PruneConfig{Retention: time.Microsecond})
				return err
			})}},
		)
	}, exploreOpts)
}

// v1 is too large for the dead-letter topic and is dead-lettered (stored
// there truncated); v2 parks behind it. The operator fixes the cause and
// requeues v1; a second operator releases the aggregate. Nothing may stay
// stranded (issue 29, bug 4), nothing be applied twice.
func TestInterleavingsOfATruncatedDeadLetterAndItsRequeue(t *testing.T) {
	t.Parallel()
	l := newLab(t, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "100000"})
	interleave.Explore(t, func(tb testing.TB) interleave.World {
		v1, v2 := anEvent("order", "o5", 1), anEvent("order", "o5", 2)
		v1.Payload = []byte(`{"pad":"` + strings.Repeat("x", 200_000) + `"}`)
		w := l.newWorld(v1, v2)
		var mu sync.Mutex
		broken := true
		c, _ := w.txConsumer(tb, func(ev event.Envelope) bool {
			mu.Lock()
			defer mu.Unlock()
			return broken && ev.EventID == v1.EventID
		})
		w.drainers = []*engine.Consumer{c}
		return w.interleaveWorld(
			interleave.Actor{Name: "W", Steps: []interleave.Step{
				step("v1", func(ctx context.Context) error { return c.Handle(ctx, w.msg(v1)) }),
				step("v2", func(ctx context.Context) error { return c.Handle(ctx, w.msg(v2)) }),
			}},
			interleave.Actor{Name: "Op", Steps: []interleave.Step{
				step("requeue", func(ctx context.Context) error {
					mu.Lock()
					broken = false // the cause is fixed first
					mu.Unlock()
					return w.requeue(ctx, v1.EventID)
				}),
			}},
			interleave.Actor{Name: "Op2", Steps: []interleave.Step{
				step("release", func(ctx context.Context) error {
					_, err := inboxadmin.ReleaseHeld(ctx, l.pool, inboxadmin.HeldAction{Consumer: w.name, AggregateType: "order", AggregateID: "o5",
						Reason: "the interleaving checker's second operator", Operator: "op2"})
					if errors.Is(err, inboxadmin.ErrNotHeld) {
						return nil // the requeue got there first, or nothing died yet
					}
					return err
				}),
			}},
		)
	}, exploreOpts)
}

// All of them on one key in lease mode: member A leases v1 and calls (the
// call books, then fails: it may have landed), then dead-letters it,
// publishing first and writing its row after; member B, a second group with
// the same inbox name, delivers v1 (taking A's lease over once it expired)
// and v2; an operator requeues v1; a pruner runs. More orderings than the
// exhaustive bound: seeded random ones (INTERLEAVE_SEED replays a run).
func TestInterleavingsOfEveryActorOnOneLeasedKey(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	opts := exploreOpts
	opts.Random = 12
	interleave.Explore(t, func(tb testing.TB) interleave.World {
		v1, v2 := anEvent("order", "o6", 1), anEvent("order", "o6", 2)
		w := l.newWorld(v1, v2)
		w.ledger = newLedger()
		w.ledger.failAfter[v1.EventID.String()] = true
		w.pruner = true
		_, a := w.leaseConsumer(tb, w.ledger.effect())
		b, _ := w.leaseConsumer(tb, w.ledger.effect())
		w.drainers = []*engine.Consumer{b}
		m := w.msg(v1)
		var (
			token         int64
			taken, skip   bool
			mayHaveCalled bool
			reason        error
			stored        engine.DLStored
		)
		ev := v1
		return w.interleaveWorld(
			interleave.Actor{Name: "A", Steps: []interleave.Step{
				step("lease", func(ctx context.Context) error {
					var out *engine.Outcome
					var err error
					token, out, taken, err = a.lease(ctx, m, &ev)
					var held *leaseHeldError
					if errors.As(err, &held) || (err == nil && out != nil) {
						skip = true
						return nil
					}
					return err
				}),
				step("call", func(ctx context.Context) error {
					if skip {
						return nil
					}
					outcome, op, err := a.runEffect(ctx, engine.Untracked{}, ev, token, time.Time{}, ev.EventID.String(), taken)
					switch {
					case errors.Is(err, errLeaseLost):
						skip = true
						return nil
					case err == nil:
						// It was booked already (a check said so), or it
						// booked now: A marks it done.
						skip = true
						return a.settleDone(ctx, engine.Delivery{Msg: m, Gen: engine.Untracked{}}, ev, token, outcome)
					}
					mayHaveCalled = taken || op == opCall
					reason = fmt.Errorf("gave up after 1 attempts: %w", err)
					return nil
				}),
				step("publish", func(ctx context.Context) error {
					if skip {
						return nil
					}
					var err error
					stored, err = a.PublishDeadLetter(ctx, m, &ev, reason)
					return err
				}),
				step("record", func(ctx context.Context) error {
					if skip {
						return nil
					}
					return pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
						return a.RecordDeadLetter(ctx, tx, m, &ev, reason, engine.LeaseRef{Token: token, MayHaveCalled: mayHaveCalled}, stored)
					})
				}),
			}},
			interleave.Actor{Name: "B", Steps: []interleave.Step{
				step("v1", func(ctx context.Context) error { return b.Handle(ctx, m) }),
				step("v2", func(ctx context.Context) error { return b.Handle(ctx, w.msg(v2)) }),
			}},
			interleave.Actor{Name: "Op", Steps: []interleave.Step{
				step("requeue", func(ctx context.Context) error {
					w.ledger.mu.Lock()
					delete(w.ledger.failAfter, v1.EventID.String())
					w.ledger.mu.Unlock()
					return w.requeue(ctx, v1.EventID)
				}),
			}},
			interleave.Actor{Name: "engine.Pruner", Steps: []interleave.Step{
				step("prune", func(ctx context.Context) error {
					_, err := engine.Prune(ctx, l.pool, engine.PruneConfig{}) // the default retention: nothing of this world's is old enough
					return err
				}),
			}},
		)
	}, opts)
}
