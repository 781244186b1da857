package cdc_test

import (
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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/interleave"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// The outbox's rows under the interleaving checker (STYLE.md rule 26): the
// actors that touch an outbox row or the slot record — writers committing
// out of id order, two relay instances, retention, a lost slot and its
// replay, an operator's requeue, a failing database, a dropped
// publication, two instances preparing one slot — each a sequence of the
// library's real steps against the real Postgres and Kafka, every ordering
// run in a fresh outbox, and after each step the invariants:
//
//   - no loss (DESIGN.md 2, 12): every committed event is on the topic, or
//     its row is still in the table (pending, to be published, or dead and
//     visible);
//   - order (4): an aggregate's event reaches the topic only after every
//     committed event of a lower version did;
//   - honest backlog: a pending row whose event is not on the topic is
//     counted pending by Backlog (never inferred published);
//
// and at the end, after the faults heal and a relay drains (after the slot
// is lost, where the world says so), every event is on the topic or dead.
// Each of issue 30's five bugs, put back, is found here; docs/outbox.md
// ("Lifecycles") lists the transitions these steps take.

// ilEnv is what the worlds of one test share: the brokers and one topic
// (each world's aggregate ids carry a prefix of its own), read once.
type ilEnv struct {
	brokers []string
	topic   string

	mu     sync.Mutex
	offset int64
	msgs   []event.Envelope
}

func newILEnv(t *testing.T, maxMessageBytes int) *ilEnv {
	t.Helper()
	e := &ilEnv{brokers: testenv.KafkaBrokers(t)}
	if maxMessageBytes > 0 {
		e.topic = newTopicWithMax(t, e.brokers, maxMessageBytes)
	} else {
		e.topic = testenv.NewTopic(t, e.brokers, 1)
	}
	return e
}

// read returns the events of the topic whose aggregate id starts with
// prefix, in offset order, reading what was added since the last read.
func (e *ilEnv) read(prefix string) ([]event.Envelope, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := kafka.DialLeader(ctx, "tcp", e.brokers[0], e.topic, 0)
	if err != nil {
		return nil, fmt.Errorf("dialing the leader of %s: %w", e.topic, err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	_, end, err := conn.ReadOffsets()
	if err != nil {
		return nil, err
	}
	for e.offset < end {
		if _, err := conn.Seek(e.offset, kafka.SeekAbsolute); err != nil {
			return nil, err
		}
		b := conn.ReadBatchWith(kafka.ReadBatchConfig{MinBytes: 1, MaxBytes: 16 << 20, MaxWait: time.Second})
		for {
			m, err := b.ReadMessage()
			if err != nil {
				break
			}
			ev, err := event.FromKafka(m)
			if err != nil {
				return nil, fmt.Errorf("undecodable message at offset %d: %w", m.Offset, err)
			}
			e.msgs = append(e.msgs, ev)
			e.offset = m.Offset + 1
		}
		if err := b.Close(); err != nil {
			return nil, err
		}
	}
	var out []event.Envelope
	for _, ev := range e.msgs {
		if strings.HasPrefix(ev.AggregateID, prefix) {
			out = append(out, ev)
		}
	}
	return out, nil
}

// outboxWorld is one fresh outbox for one schedule: a database of its own,
// a slot name, the events committed so far.
type outboxWorld struct {
	env    *ilEnv
	pool   *pgxpool.Pool
	slot   string
	prefix string
	cfg    cdc.Config
	reg    *prometheus.Registry

	mu        sync.Mutex
	committed []event.Envelope
	closers   []func()
}

func newOutboxWorld(t testing.TB, env *ilEnv, mode outbox.RelayMode) *outboxWorld {
	t.Helper()
	url := testenv.NewMigratedDatabase(t, testenv.Migration{FS: outbox.Migrations, Table: outbox.MigrationsTable})
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 10 // a world may hold a few open transactions while its relays run
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	w := &outboxWorld{env: env, pool: pool, slot: testenv.Name("slot"), prefix: testenv.Name("w") + "-",
		reg: prometheus.NewRegistry()}
	w.cfg = cdc.Config{Slot: w.slot, Mode: mode, Topic: func(string) string { return env.topic },
		StatusInterval: 20 * time.Millisecond, RetentionInterval: 50 * time.Millisecond, Retain: time.Nanosecond,
		LagInterval: time.Hour, MaxAttempts: 1, BackoffMin: 5 * time.Millisecond, BackoffMax: 10 * time.Millisecond,
		OutageBackoffMin: 10 * time.Millisecond, OutageBackoffMax: 50 * time.Millisecond, PublishTimeout: 5 * time.Second,
		Metrics: outbox.NewMetrics(w.reg), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	return w
}

// close drops the slot (a database with one cannot be dropped) and the
// pool; the database itself goes when the test ends.
func (w *outboxWorld) close() {
	for i := len(w.closers) - 1; i >= 0; i-- {
		w.closers[i]()
	}
	// 55006 while the walsender is still going away: try again a while.
	testenv.Eventually(20*time.Second, func() bool {
		_, err := w.pool.Exec(context.Background(),
			`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, w.slot)
		return err == nil
	})
	w.pool.Close()
}

func (w *outboxWorld) event(agg string, version int64, big bool) event.Envelope {
	ev := newEvent(w.prefix+agg, version)
	if big {
		ev.Payload = blob("x", bigBlob)
	}
	return ev
}

func (w *outboxWorld) commit(evs ...event.Envelope) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.committed = append(w.committed, evs...)
}

// enqueue commits evs in one transaction (Enqueue).
func (w *outboxWorld) enqueue(ctx context.Context, evs ...event.Envelope) error {
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error { return outbox.EnqueueBatch(ctx, tx, evs...) })
	if err == nil {
		w.commit(evs...)
	}
	return err
}

// stream runs a log-based relay on the world's slot (a new instance each
// time: what a restart or a second instance holds in memory starts empty)
// until the slot confirmed everything committed before the step, or for
// at most a second and a half (a relay that cannot confirm: Kafka refusing,
// a mark failing, a stalled stream), and stops it.
func (w *outboxWorld) stream(ctx context.Context, wr outbox.Writer) error {
	relay, err := cdc.NewRelay(w.pool, wr, w.cfg)
	if err != nil {
		return err
	}
	var target string
	if err := w.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		var passed bool
		err := w.pool.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn >= $2::pg_lsn, false)
			FROM pg_replication_slots WHERE slot_name = $1`, w.slot, target).Scan(&passed)
		if err == nil && passed && relay.Active() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// retain runs one round of the relay's retention.
func (w *outboxWorld) retain(ctx context.Context) error {
	relay, err := cdc.NewRelay(w.pool, testenv.NewWriter(w.env.brokers, 1), w.cfg)
	if err != nil {
		return err
	}
	return relay.RetainOnce(ctx)
}

// loseSlot drops the slot, as an operator's mistake or
// max_slot_wal_keep_size would (no relay runs between steps).
func (w *outboxWorld) loseSlot(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := w.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, w.slot)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select { // 55006 while the last walsender goes away
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// check is the invariants after every step (see the top of the file).
func (w *outboxWorld) check(ctx context.Context) error {
	rep, err := outboxadmin.Backlog(ctx, w.pool, outboxadmin.BacklogConfig{Samples: 1000})
	if err != nil {
		return err
	}
	counted := map[uuid.UUID]bool{}
	for _, id := range rep.Pending.Samples {
		counted[id] = true
	}
	rows := map[uuid.UUID]string{}
	rs, err := w.pool.Query(ctx, `SELECT event_id, state FROM outbox_events`)
	if err != nil {
		return err
	}
	var (
		id    uuid.UUID
		state string
	)
	if _, err := pgx.ForEachRow(rs, []any{&id, &state}, func() error {
		if rows[id] != "pending" { // a pending copy beside a dead original counts as pending
			rows[id] = state
		}
		return nil
	}); err != nil {
		return err
	}
	published, err := w.env.read(w.prefix)
	if err != nil {
		return err
	}
	onTopic := map[uuid.UUID]bool{}
	for _, ev := range published {
		onTopic[ev.EventID] = true
	}
	w.mu.Lock()
	committed := append([]event.Envelope(nil), w.committed...)
	w.mu.Unlock()
	for _, ev := range committed {
		switch {
		case !onTopic[ev.EventID] && rows[ev.EventID] == "":
			return fmt.Errorf("LOST: %s/%d (event %s) was committed and is neither on the topic nor in the table",
				ev.AggregateID, ev.AggregateVersion, ev.EventID)
		case !onTopic[ev.EventID] && rows[ev.EventID] == "pending" && !counted[ev.EventID]:
			return fmt.Errorf("BACKLOG: %s/%d is pending and not on the topic, but Backlog does not count it pending (taken for published)",
				ev.AggregateID, ev.AggregateVersion)
		}
	}
	return checkOrder(published, committed)
}

// checkOrder: an event reaches the topic only after every committed event
// of its aggregate with a lower version did.
func checkOrder(published, committed []event.Envelope) error {
	seen := map[uuid.UUID]bool{}
	for _, p := range published {
		for _, c := range committed {
			if c.AggregateID == p.AggregateID && c.AggregateVersion < p.AggregateVersion && !seen[c.EventID] {
				return fmt.Errorf("ORDER: %s/%d reached the topic before %s/%d", p.AggregateID, p.AggregateVersion, c.AggregateID, c.AggregateVersion)
			}
		}
		seen[p.EventID] = true
	}
	return nil
}

// drained: every committed event is on the topic or dead in the table.
func (w *outboxWorld) drained(ctx context.Context) error {
	published, err := w.env.read(w.prefix)
	if err != nil {
		return err
	}
	onTopic := map[uuid.UUID]bool{}
	for _, ev := range published {
		onTopic[ev.EventID] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ev := range w.committed {
		if onTopic[ev.EventID] {
			continue
		}
		if w.cfg.Mode == outbox.ModeWAL {
			return fmt.Errorf("LOST: %s/%d, emitted after its instance's Prepare returned, was never published", ev.AggregateID, ev.AggregateVersion)
		}
		var dead bool
		if err := w.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_events WHERE event_id = $1 AND state = 'dead')`,
			ev.EventID).Scan(&dead); err != nil {
			return err
		}
		if !dead {
			return fmt.Errorf("after the drain %s/%d is neither on the topic nor dead", ev.AggregateID, ev.AggregateVersion)
		}
	}
	return nil
}

// drain streams until every committed event is on the topic or dead, for
// up to 30 seconds: a new slot (after a lost one) is consistent only once
// every transaction running in the cluster ended, other tests' too.
func (w *outboxWorld) drain(ctx context.Context, wr outbox.Writer) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := w.stream(ctx, wr); err != nil {
			return err
		}
		err := w.drained(ctx)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

func step(name string, run func(context.Context) error) interleave.Step {
	return interleave.Step{Name: name, Run: run}
}

func actor(name string, steps ...interleave.Step) interleave.Actor {
	return interleave.Actor{Name: name, Steps: steps}
}

// ilOptions: a stream step takes up to a second and a half; none of these
// worlds' steps waits on another's lock, so anything slower than that is a
// step stuck, not one blocked.
var ilOptions = interleave.Options{BlockAfter: 4 * time.Second, StepTimeout: 30 * time.Second, Seed: 30}

// A writer commits out of id order (A inserted a/1 first, B's b/1 commits
// first), a relay streams, retention runs, and at the end the slot is
// lost and a relay replays the gap from the table. Finds bug 2 (retention
// by the highest confirmed id deletes a/1 before anyone published it).
func TestInterleaveCommitOrderRetentionAndALostSlot(t *testing.T) {
	t.Parallel()
	env := newILEnv(t, 0)
	w := testenv.NewWriter(env.brokers, 10)
	t.Cleanup(func() { w.Close() })
	res := interleave.Explore(t, func(t testing.TB) interleave.World {
		ow := newOutboxWorld(t, env, outbox.ModeCDC)
		if err := ow.prepare(context.Background(), w); err != nil {
			t.Fatal(err)
		}
		a1, b1 := ow.event("a", 1, false), ow.event("b", 1, false)
		var txA pgx.Tx
		return interleave.World{
			Actors: []interleave.Actor{
				actor("A",
					step("insert", func(ctx context.Context) error {
						var err error
						if txA, err = ow.pool.Begin(ctx); err != nil {
							return err
						}
						return outbox.Enqueue(ctx, txA, a1)
					}),
					step("commit", func(ctx context.Context) error {
						if err := txA.Commit(ctx); err != nil {
							return err
						}
						ow.commit(a1)
						return nil
					})),
				actor("B",
					step("enqueue", func(ctx context.Context) error { return ow.enqueue(ctx, b1) }),
					step("stream", func(ctx context.Context) error { return ow.stream(ctx, w) })),
				actor("T", step("retain", ow.retain)),
			},
			Check: ow.check,
			Final: func(ctx context.Context) error {
				if err := ow.loseSlot(ctx); err != nil {
					return err
				}
				if err := ow.drain(ctx, w); err != nil {
					return err
				}
				return ow.check(ctx)
			},
			Close: func() {
				if txA != nil {
					_ = txA.Rollback(context.Background())
				}
				ow.close()
			},
		}
	}, ilOptions)
	t.Logf("commit order, retention, lost slot: %s", res)
}

// big/1 is refused by the topic and goes dead, big/2 is held behind it;
// two relay instances stream, and an operator requeues the head (its copy
// refused again) and then every dead row. Finds bug 4 (the copy held
// behind its successor by "lowest dead id", the successor published
// first).
func TestInterleaveTwoRelaysAndAnOperatorRequeue(t *testing.T) {
	t.Parallel()
	env := newILEnv(t, 100<<10)
	w := testenv.NewWriter(env.brokers, 10)
	t.Cleanup(func() { w.Close() })
	res := interleave.Explore(t, func(t testing.TB) interleave.World {
		ow := newOutboxWorld(t, env, outbox.ModeCDC)
		ctx := context.Background()
		if err := ow.prepare(ctx, w); err != nil {
			t.Fatal(err)
		}
		big1, big2 := ow.event("big", 1, true), ow.event("big", 2, false)
		if err := ow.enqueue(ctx, big1); err != nil {
			t.Fatal(err)
		}
		if err := ow.enqueue(ctx, big2); err != nil {
			t.Fatal(err)
		}
		return interleave.World{
			Actors: []interleave.Actor{
				actor("R1", step("stream", func(ctx context.Context) error { return ow.stream(ctx, w) })),
				actor("R2", step("stream", func(ctx context.Context) error { return ow.stream(ctx, w) })),
				actor("O",
					step("requeue-head", func(ctx context.Context) error {
						var ids []int64
						err := ow.pool.QueryRow(ctx, `SELECT coalesce(array_agg(id), '{}') FROM outbox_events
							WHERE state = 'dead' AND aggregate_version = 1`).Scan(&ids)
						if err == nil {
							_, err = outboxadmin.Requeue(ctx, ow.pool, outbox.ModeCDC, ids...)
						}
						return err
					}),
					step("requeue-all", func(ctx context.Context) error {
						_, err := outboxadmin.RequeueDead(ctx, ow.pool, outbox.ModeCDC, outboxadmin.DeadFilter{})
						return err
					})),
			},
			Check: ow.check,
			Final: func(ctx context.Context) error {
				if err := ow.drain(ctx, w); err != nil {
					return err
				}
				return ow.check(ctx)
			},
			Close: ow.close,
		}
	}, ilOptions)
	t.Logf("two relays and a requeue: %s", res)
}

// prepare creates the world's slot before the schedule (Prepare), so the
// steps' streams start at the same place whatever their order.
func (w *outboxWorld) prepare(ctx context.Context, wr outbox.Writer) error {
	relay, err := cdc.NewRelay(w.pool, wr, w.cfg)
	if err != nil {
		return err
	}
	return relay.Prepare(ctx)
}

// big/1 is refused and its dead mark fails while the database is away
// (F.break … F.heal); two relay instances stream, each with the eagerest
// retention. Finds bug 1 (the relay confirmed past big/1 with its mark
// failed: retention deleted the row and big/2 went out alone).
func TestInterleaveAFailingDeadMark(t *testing.T) {
	t.Parallel()
	env := newILEnv(t, 100<<10)
	w := testenv.NewWriter(env.brokers, 10)
	t.Cleanup(func() { w.Close() })
	res := interleave.Explore(t, func(t testing.TB) interleave.World {
		ow := newOutboxWorld(t, env, outbox.ModeCDC)
		ctx := context.Background()
		if err := ow.prepare(ctx, w); err != nil {
			t.Fatal(err)
		}
		for _, stmt := range []string{
			`CREATE TABLE test_fail_dead_marks (on_ boolean)`,
			`CREATE FUNCTION test_fail_dead_mark() RETURNS trigger LANGUAGE plpgsql AS $$
			 BEGIN
			     IF NEW.state = 'dead' AND EXISTS (SELECT 1 FROM test_fail_dead_marks) THEN
			         RAISE EXCEPTION 'injected: the dead mark did not reach the disk';
			     END IF;
			     RETURN NEW;
			 END $$`,
			`CREATE TRIGGER test_fail_dead_mark BEFORE UPDATE ON outbox_events FOR EACH ROW EXECUTE FUNCTION test_fail_dead_mark()`,
		} {
			if _, err := ow.pool.Exec(ctx, stmt); err != nil {
				t.Fatal(err)
			}
		}
		heal := func(ctx context.Context) error {
			_, err := ow.pool.Exec(ctx, `DELETE FROM test_fail_dead_marks`)
			return err
		}
		if err := ow.enqueue(ctx, ow.event("big", 1, true)); err != nil {
			t.Fatal(err)
		}
		if err := ow.enqueue(ctx, ow.event("big", 2, false)); err != nil {
			t.Fatal(err)
		}
		return interleave.World{
			Actors: []interleave.Actor{
				actor("F",
					step("break", func(ctx context.Context) error {
						_, err := ow.pool.Exec(ctx, `INSERT INTO test_fail_dead_marks VALUES (true)`)
						return err
					}),
					step("heal", heal)),
				actor("R1", step("stream", func(ctx context.Context) error { return ow.stream(ctx, w) })),
				actor("R2", step("stream", func(ctx context.Context) error { return ow.stream(ctx, w) })),
			},
			Check: ow.check,
			Final: func(ctx context.Context) error {
				if err := heal(ctx); err != nil {
					return err
				}
				if err := ow.drain(ctx, w); err != nil {
					return err
				}
				return ow.check(ctx)
			},
			Close: ow.close,
		}
	}, ilOptions)
	t.Logf("a failing dead mark: %s", res)
}

// The publication is dropped and created again (O) around a commit (W)
// while a relay streams (R). A change committed while it was missing
// stalls every stream there: at the end either everything is published,
// or the relay named the stall (outbox_slot_publication_missing_total,
// not active); then the runbook (drop the slot) publishes everything.
// Finds bug 5 (a stall nobody names).
func TestInterleaveAPublicationDroppedAndRecreated(t *testing.T) {
	t.Parallel()
	env := newILEnv(t, 0)
	w := testenv.NewWriter(env.brokers, 10)
	t.Cleanup(func() { w.Close() })
	res := interleave.Explore(t, func(t testing.TB) interleave.World {
		ow := newOutboxWorld(t, env, outbox.ModeCDC)
		if err := ow.prepare(context.Background(), w); err != nil {
			t.Fatal(err)
		}
		p1 := ow.event("p", 1, false)
		return interleave.World{
			Actors: []interleave.Actor{
				actor("O",
					step("drop", func(ctx context.Context) error {
						_, err := ow.pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+cdc.Publication)
						return err
					}),
					step("create", func(ctx context.Context) error {
						_, err := ow.pool.Exec(ctx, `CREATE PUBLICATION `+cdc.Publication+` FOR TABLE outbox_events WITH (publish = 'insert')`)
						if err != nil && strings.Contains(err.Error(), "42710") {
							err = nil // a relay made it again on its reconnect
						}
						return err
					})),
				actor("W", step("enqueue", func(ctx context.Context) error { return ow.enqueue(ctx, p1) })),
				actor("R", step("stream", func(ctx context.Context) error { return ow.stream(ctx, w) })),
			},
			Check: ow.check,
			Final: func(ctx context.Context) error {
				if _, err := ow.pool.Exec(ctx, `CREATE PUBLICATION `+cdc.Publication+` FOR TABLE outbox_events WITH (publish = 'insert')`); err != nil &&
					!strings.Contains(err.Error(), "42710") {
					return err
				}
				if err := ow.stream(ctx, w); err != nil {
					return err
				}
				if ow.drained(ctx) == nil {
					return nil
				}
				if n := testenv.MetricValue(t, ow.reg, "outbox_slot_publication_missing_total"); n == 0 {
					return errors.New("STALLED SILENTLY: the stream cannot move past p/1 and the relay never said so (outbox_slot_publication_missing_total is 0)")
				}
				// The runbook.
				if err := ow.loseSlot(ctx); err != nil {
					return err
				}
				return ow.drain(ctx, w)
			},
			Close: ow.close,
		}
	}, ilOptions)
	t.Logf("a publication dropped and recreated: %s", res)
}

// Two instances of a WAL-only service prepare one slot while a
// transaction runs (so the slot cannot be consistent until it ends): one
// creates it, the other finds it being created (42710 or a slot without a
// position). An instance emits right after its own Prepare returned;
// every such event must be published. Finds bug 3 (Prepare returned while
// the slot was not consistent: the event was decoded by no one).
func TestInterleaveWALInstancesPreparingTogether(t *testing.T) {
	t.Parallel()
	env := newILEnv(t, 0)
	w := testenv.NewWriter(env.brokers, 10)
	t.Cleanup(func() { w.Close() })
	opts := ilOptions
	opts.BlockAfter = 500 * time.Millisecond // a Prepare waits for the slot: blocked on X's steps
	res := interleave.Explore(t, func(t testing.TB) interleave.World {
		ow := newOutboxWorld(t, env, outbox.ModeWAL)
		ctx := context.Background()
		// Both instances find no slot, then wait at its record (a first
		// start's): both go on to create it.
		if _, err := ow.pool.Exec(ctx, `INSERT INTO outbox_cdc_slots (slot_name, confirmed_lsn) VALUES ($1, '0/0')`, ow.slot); err != nil {
			t.Fatal(err)
		}
		gate, err := ow.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gate.Exec(ctx, `SELECT FROM outbox_cdc_slots WHERE slot_name = $1 FOR UPDATE`, ow.slot); err != nil {
			t.Fatal(err)
		}
		running, err := ow.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := running.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
			t.Fatal(err)
		}
		instance := func() cdc.Publisher {
			p, err := cdc.NewPublisher(ow.pool, w, cdc.PublisherConfig{Mode: outbox.ModeWAL, CDC: ow.cfgWAL()})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		p1, p2 := instance(), instance()
		ev := ow.event("w", 1, false)
		return interleave.World{
			Actors: []interleave.Actor{
				actor("P1", step("prepare", p1.Prepare)),
				actor("P2", step("prepare-then-emit", func(ctx context.Context) error {
					if err := p2.Prepare(ctx); err != nil {
						return err
					}
					if err := pgx.BeginFunc(ctx, ow.pool, func(tx pgx.Tx) error { return cdc.Emit(ctx, tx, ev) }); err != nil {
						return err
					}
					ow.commit(ev)
					return nil
				})),
				actor("X",
					step("open-gate", func(ctx context.Context) error { return gate.Commit(ctx) }),
					step("end-running", func(ctx context.Context) error { return running.Commit(ctx) })),
			},
			Final: func(ctx context.Context) error {
				// drained, in WAL-only mode: nothing is ever dead there.
				return ow.drain(ctx, w)
			},
			Close: func() {
				_ = gate.Rollback(context.Background())
				_ = running.Rollback(context.Background())
				ow.close()
			},
		}
	}, opts)
	t.Logf("WAL-only instances preparing together: %s", res)
}

// cfgWAL is the world's config for a Publisher in ModeWAL, which sets the
// mode itself.
func (w *outboxWorld) cfgWAL() cdc.Config {
	c := w.cfg
	c.Mode = ""
	return c
}
