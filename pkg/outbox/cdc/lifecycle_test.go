package cdc_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// The five ways issue 30 found the log-based relay losing, reordering or
// stalling events, each forced deterministically against the real Postgres
// and Kafka. Each failed at a4ed9c3; the note of the fix says how.

// failDeadMarks makes every UPDATE that sets an outbox row dead fail, as a
// Postgres restart or a timeout at that moment would, until the returned
// func lets them through again.
func failDeadMarks(t *testing.T, pool *pgxpool.Pool) (heal func()) {
	t.Helper()
	ctx := context.Background()
	for _, stmt := range []string{
		`CREATE TABLE test_fail_dead_marks (on_ boolean)`,
		`INSERT INTO test_fail_dead_marks VALUES (true)`,
		`CREATE FUNCTION test_fail_dead_mark() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		     IF NEW.state = 'dead' AND EXISTS (SELECT 1 FROM test_fail_dead_marks) THEN
		         RAISE EXCEPTION 'injected: the dead mark did not reach the disk';
		     END IF;
		     RETURN NEW;
		 END $$`,
		`CREATE TRIGGER test_fail_dead_mark BEFORE UPDATE ON outbox_events
		 FOR EACH ROW EXECUTE FUNCTION test_fail_dead_mark()`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		if _, err := pool.Exec(ctx, `DELETE FROM test_fail_dead_marks`); err != nil {
			t.Fatal(err)
		}
	}
}

// Bug 1. When the mark of a skipped row fails, the relay must not
// acknowledge the row: the slot stays before it, so the next stream
// delivers it again and marks it then. Before the fix the relay only
// logged the failure and confirmed past the row, which stayed pending
// below the confirmed id: after a restart no hold was loaded, big/2 went
// out with big/1 never published, and retention deleted big/1's row.
func TestCDCFailedDeadMarkIsNotConfirmedPast(t *testing.T) {
	t.Parallel()
	e, cfg := newHoldbackCDCEnv(t, 1)
	reg := prometheus.NewRegistry()
	cfg.Metrics = outbox.NewMetrics(reg)
	cfg.RetentionInterval, cfg.Retain = 50*time.Millisecond, time.Nanosecond
	cfg.OutageBackoffMin, cfg.OutageBackoffMax = 20*time.Millisecond, 100*time.Millisecond
	heal := failDeadMarks(t, e.Pool)

	stop := runStreaming(t, newCDC(t, e.Pool, e.W, cfg))
	big1 := newEvent("big", 1)
	big1.Payload = blob("x", bigBlob)
	enqueue(t, e.Pool, big1)
	afterBig1 := currentLSN(t, e.Pool)
	// Either the relay confirms past big/1 (the bug), or it gives big/1 to
	// a stream again, which refuses and tries to mark it again.
	testenv.WaitFor(t, 30*time.Second, "big/1 skipped (its mark failing), then confirmed or tried again", func() (bool, error) {
		return confirmedLSN(t, e.Pool, e.slot) >= afterBig1 ||
			testenv.LabeledMetricValue(t, reg, "outbox_db_errors_total", map[string]string{"op": "slot"}) >= 2, nil
	})
	stop()
	heal()

	// The restarted relay, with the database healthy again, and the
	// aggregate's next event.
	runStreaming(t, newCDC(t, e.Pool, e.W, cfg))
	big2 := newEvent("big", 2)
	enqueue(t, e.Pool, big2)
	where2 := "event_id = '" + big2.EventID.String() + "'"
	testenv.WaitFor(t, 30*time.Second, "big/2 held back or published", func() (bool, error) {
		return countRows(t, e.Pool, where2+" AND state = 'dead'") == 1 ||
			slices.Contains(onTopic(t, e.Brokers, e.Topic), "big/2"), nil
	})
	if got := onTopic(t, e.Brokers, e.Topic); slices.Contains(got, "big/2") {
		t.Errorf("the topic holds %v: big/2 went out although big/1 was never published", got)
	}
	where1 := "event_id = '" + big1.EventID.String() + "'"
	if n := countRows(t, e.Pool, where1+" AND state = 'dead'"); n != 1 {
		t.Errorf("big/1's row: %d dead (%d rows in any state), want it dead: the relay confirmed past it while its mark had failed",
			n, countRows(t, e.Pool, where1))
	}
}

// Bug 2. Ids come from the sequence at INSERT, not at commit: a
// transaction that inserted a/1 before b/1 and commits after it has the
// lower id while b/1 is confirmed first. Retention must keep a/1 until its
// own commit is confirmed; before the fix it deleted every pending row up
// to the highest confirmed id, and the row a lost slot's replay needs was
// gone. Here the relay after a/1's commit cannot publish (its Kafka is
// away), as during a long outage, the case a lost slot comes with.
func TestCDCRetentionKeepsARowCommittedAfterAHigherOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newCDCEnv(t, 1, 10)
	cfg := e.config()
	cfg.RetentionInterval, cfg.Retain = 50*time.Millisecond, time.Hour
	stop := runStreaming(t, newCDC(t, e.Pool, e.W, cfg))

	z1 := newEvent("z", 1)
	enqueue(t, e.Pool, z1)
	testenv.WaitFor(t, 20*time.Second, "z/1 published", func() (bool, error) { return e.C.Has(z1.EventID), nil })

	a1, b1 := newEvent("a", 1), newEvent("b", 1)
	txA, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx) //nolint:errcheck // committed below
	if err := outbox.Enqueue(ctx, txA, a1); err != nil {
		t.Fatal(err)
	}
	enqueue(t, e.Pool, b1)
	afterB := currentLSN(t, e.Pool)
	testenv.WaitFor(t, 20*time.Second, "b/1 published and its position recorded", func() (bool, error) {
		var ok bool
		err := e.Pool.QueryRow(ctx, `SELECT confirmed_lsn >= $2::pg_lsn FROM outbox_cdc_slots WHERE slot_name = $1`,
			e.slot, afterB.String()).Scan(&ok)
		return ok && e.C.Has(b1.EventID), err
	})
	// z/1 counted published (the slot record's horizon passed it) while
	// this relay could still confirm: the next one cannot confirm anything
	// past a/1, so on a loaded machine, where retention's first horizon
	// may come after b/1, it would never promote one, and "published long
	// ago" would be untrue of z/1.
	testenv.WaitFor(t, 30*time.Second, "z/1 counted published by the slot record", func() (bool, error) {
		return countRows(t, e.Pool, "event_id = '"+z1.EventID.String()+"' AND EXISTS (SELECT 1 FROM outbox_cdc_slots s "+
			"WHERE outbox_events.id <= s.confirmed_id AND age(outbox_events.xmin) > age(s.published_xmin))") == 1, nil
	})
	stop()
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// The next relay streams a/1 but cannot publish it; its retention is
	// as eager as it gets.
	away := testenv.NewWriter([]string{"127.0.0.1:1"}, 10)
	t.Cleanup(func() { away.Close() })
	cfg.Retain, cfg.PublishTimeout = time.Nanosecond, time.Second
	runCDC(t, newCDC(t, e.Pool, away, cfg))
	testenv.WaitFor(t, 60*time.Second, "retention to delete z/1, published long ago", func() (bool, error) {
		return countRows(t, e.Pool, "event_id = '"+z1.EventID.String()+"'") == 0, nil
	})
	if n := countRows(t, e.Pool, "event_id = '"+a1.EventID.String()+"'"); n != 1 {
		t.Fatalf("a/1's row is gone (%d rows): retention deleted it before any relay published it, "+
			"because its id is below b/1's, which committed first; a lost slot's replay would never find it", n)
	}
}

// Bug 3. A logical slot is consistent only once every transaction running
// at its creation has ended; an event committed before that point is
// decoded by no one. Prepare, which a WAL-only service calls before it
// takes writes, must return only when the slot is consistent, also when
// another instance is the one creating it (42710). Before the fix it
// returned at once, and the event emitted next was lost.
func TestWALPrepareWaitsForASlotAnotherInstanceIsCreating(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := newCDCEnv(t, 1, 50)
	cfg := e.config()
	cfg.StatusInterval = 100 * time.Millisecond
	cfg.OutageBackoffMin, cfg.OutageBackoffMax = 20*time.Millisecond, 100*time.Millisecond
	newPublisher := func() cdc.Publisher {
		// A pool of its own: the test holds two of e.Pool's connections.
		p, err := cdc.NewPublisher(testenv.NewPool(t, e.URL), e.W, cdc.PublisherConfig{Mode: outbox.ModeWAL, CDC: cfg})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	// A transaction running when the slot is created keeps it from being
	// consistent until it ends.
	running, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := running.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	// Both instances find no slot and then wait on the slot's record (a
	// first start's, position 0/0), so that both go on to create it: one
	// gets 42710.
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox_cdc_slots (slot_name, confirmed_lsn) VALUES ($1, '0/0')`, e.slot); err != nil {
		t.Fatal(err)
	}
	gate, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := gate.Exec(ctx, `SELECT FROM outbox_cdc_slots WHERE slot_name = $1 FOR UPDATE`, e.slot); err != nil {
		t.Fatal(err)
	}
	first, second := newPublisher(), newPublisher()
	done := make(chan error, 2)
	go func() { done <- first.Prepare(ctx) }()
	go func() { done <- second.Prepare(ctx) }()
	testenv.WaitFor(t, 20*time.Second, "both instances at the slot's record", func() (bool, error) {
		var n int
		err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return n == 2, err
	})
	if err := gate.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	secondDone := done

	// The service takes writes as soon as its Prepare returns.
	ev := newEvent("w", 1)
	select {
	case err := <-secondDone:
		if err != nil {
			t.Fatal(err)
		}
		emit(t, e.Pool, ev)
		if err := running.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		// Still waiting for the slot, as it should: let it become
		// consistent.
		if err := running.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-secondDone; err != nil {
			t.Fatal(err)
		}
		emit(t, e.Pool, ev)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "Run", second.Run)
	later := newEvent("w", 2)
	emit(t, e.Pool, later)
	testenv.WaitFor(t, 30*time.Second, "w/2 published", func() (bool, error) { return e.C.Has(later.EventID), nil })
	if !e.C.Has(ev.EventID) {
		t.Fatal("w/1, emitted after Prepare returned, was never published: the slot was not consistent yet and decoded no one's commit before it")
	}
}

// Bug 4. A requeue deletes the dead row and inserts a copy under a new,
// higher id. The copy of the head (big/1), refused again, was held behind
// its own successor (big/2, "the lowest dead id"), and requeueing every
// dead row, oldest id first, published big/2 before big/1. Holds are by
// aggregate version, loaded before the stream delivers.
func TestCDCRequeuedDeadHeadGoesOutBeforeItsSuccessor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, cfg := newHoldbackCDCEnv(t, 1)
	stop := runStreaming(t, newCDC(t, e.Pool, e.W, cfg))

	big1, big2 := newEvent("big", 1), newEvent("big", 2)
	big1.Payload = blob("x", bigBlob)
	enqueue(t, e.Pool, big1)
	enqueue(t, e.Pool, big2)
	testenv.WaitFor(t, 30*time.Second, "big/1 dead and big/2 held behind it", func() (bool, error) {
		return countRows(t, e.Pool, "state = 'dead'") == 2, nil
	})
	// The operator requeues the head before the topic takes it: its copy
	// is refused again.
	var headID int64
	if err := e.Pool.QueryRow(ctx, `SELECT id FROM outbox_events WHERE event_id = $1`, big1.EventID).Scan(&headID); err != nil {
		t.Fatal(err)
	}
	if n, err := outboxadmin.Requeue(ctx, e.Pool, outbox.ModeCDC, headID); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v; want 1", n, err)
	}
	testenv.WaitFor(t, 30*time.Second, "the head's copy dead again", func() (bool, error) {
		return countRows(t, e.Pool, "state = 'dead' AND aggregate_version = 1") == 1 &&
			countRows(t, e.Pool, "state = 'dead'") == 2, nil
	})
	stop()

	raiseTopicMax(t, e.Brokers, e.Topic)
	wide := newWideWriter(e.Brokers)
	t.Cleanup(func() { wide.Close() })
	runStreaming(t, newCDC(t, e.Pool, wide, cfg))
	if n, err := outboxadmin.RequeueDead(ctx, e.Pool, outbox.ModeCDC, outboxadmin.DeadFilter{}); err != nil || n != 2 {
		t.Fatalf("RequeueDead = %d, %v; want 2", n, err)
	}
	bigs := func() []string {
		return slices.DeleteFunc(onTopic(t, e.Brokers, e.Topic), func(s string) bool { return !strings.HasPrefix(s, "big/") })
	}
	testenv.WaitFor(t, 30*time.Second, "both requeued events", func() (bool, error) {
		return len(bigs()) >= 2 || countRows(t, e.Pool, "state = 'dead'") > 0 && len(bigs()) >= 1, nil
	})
	if got := bigs(); !slices.Equal(got, []string{"big/1", "big/2"}) {
		t.Fatalf("after requeueing every dead row the topic holds %v, want [big/1 big/2]", got)
	}
}

// Bug 5. pgoutput resolves the publication in each change's historic
// snapshot: a change committed while the publication was dropped fails
// every stream from that point with 42704, whatever exists now. The relay
// must name it, count it (outbox_slot_publication_missing_total, alert
// OutboxPublicationMissing) and not call itself streaming; the runbook
// (docs/runbook-cdc.md: drop the slot, the relay replays the window from
// the table) then publishes what was committed meanwhile. Before the fix
// the relay reconnected for good, saying only "streaming".
func TestCDCRecreatedPublicationIsNamedAndTheRunbookRecovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newCDCEnv(t, 1, 10)
	cfg := e.config()
	reg := prometheus.NewRegistry()
	cfg.Metrics = outbox.NewMetrics(reg)
	cfg.OutageBackoffMin, cfg.OutageBackoffMax = 20*time.Millisecond, 200*time.Millisecond
	relay := newCDC(t, e.Pool, e.W, cfg)
	runStreaming(t, relay)
	p1 := newEvent("p", 1)
	enqueue(t, e.Pool, p1)
	testenv.WaitFor(t, 20*time.Second, "p/1 published", func() (bool, error) { return e.C.Has(p1.EventID), nil })

	if _, err := e.Pool.Exec(ctx, `DROP PUBLICATION `+cdc.Publication); err != nil {
		t.Fatal(err)
	}
	p2 := newEvent("p", 2)
	enqueue(t, e.Pool, p2)
	// The relay may have created it again itself, on a reconnect.
	if _, err := e.Pool.Exec(ctx, `CREATE PUBLICATION `+cdc.Publication+` FOR TABLE outbox_events WITH (publish = 'insert')`); err != nil &&
		!strings.Contains(err.Error(), "42710") {
		t.Fatal(err)
	}
	p3 := newEvent("p", 3)
	enqueue(t, e.Pool, p3)

	testenv.WaitFor(t, 30*time.Second, "the relay to name the missing publication", func() (bool, error) {
		return testenv.MetricValue(t, reg, "outbox_slot_publication_missing_total") >= 1, nil
	})
	if e.C.Has(p2.EventID) || e.C.Has(p3.EventID) {
		t.Fatal("p/2 or p/3 published while the stream cannot decode past p/2's commit")
	}
	if relay.Active() {
		t.Error("the relay reports it streams while every stream fails on the missing publication")
	}
	// The runbook: drop the slot while no stream holds it; the relay makes
	// a new one and republishes the window from the table.
	testenv.WaitFor(t, 30*time.Second, "the slot dropped", func() (bool, error) {
		var n int
		err := e.Pool.QueryRow(ctx, `SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots
			WHERE slot_name = $1 AND NOT active`, e.slot).Scan(&n)
		if err != nil && strings.Contains(err.Error(), "55006") {
			return false, nil // a stream took it meanwhile
		}
		return n == 1, err
	})
	testenv.WaitFor(t, 30*time.Second, "p/2 and p/3 republished", func() (bool, error) {
		return e.C.Has(p2.EventID) && e.C.Has(p3.EventID), nil
	})
}

// Backlog's pending means not yet published, in table mode too: the
// log-based relay never marks a row, and a row it published stays
// 'pending' until retention deletes it (after Retain). Before, Backlog (and
// so make reconcile, "outbox_stuck") counted every such row, so a longer
// Retain read as a stuck relay.
func TestBacklogLeavesOutRowsTheLogBasedRelayPublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newCDCEnv(t, 1, 10)
	cfg := e.config()
	cfg.RetentionInterval, cfg.Retain = 50*time.Millisecond, time.Hour
	stop := runStreaming(t, newCDC(t, e.Pool, e.W, cfg))
	published := []uuid.UUID{}
	for v := int64(1); v <= 3; v++ {
		ev := newEvent("k", v)
		enqueue(t, e.Pool, ev)
		published = append(published, ev.EventID)
	}
	testenv.WaitFor(t, 20*time.Second, "k/1..3 published", func() (bool, error) { return e.C.Distinct() == 3, nil })
	// What the relay published is known once its slot confirmed it (within
	// a RetentionInterval or two): then Backlog counts none of it.
	var rep outboxadmin.BacklogReport
	testenv.WaitFor(t, 30*time.Second, "Backlog to count nothing pending", func() (bool, error) {
		var err error
		rep, err = outboxadmin.Backlog(ctx, e.Pool, outboxadmin.BacklogConfig{Samples: 10})
		return err == nil && rep.Pending.Count == 0, err
	})
	stop()
	late := newEvent("k", 4)
	enqueue(t, e.Pool, late)
	rep, err := outboxadmin.Backlog(ctx, e.Pool, outboxadmin.BacklogConfig{Samples: 10})
	if err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, e.Pool, "state = 'pending'"); n != 4 {
		t.Fatalf("%d rows pending, want 4: retention must keep the published ones for Retain", n)
	}
	if rep.Pending.Count != 1 || !slices.Equal(rep.Pending.Samples, []uuid.UUID{late.EventID}) {
		t.Fatalf("Backlog pending %+v, want k/4 (%s) alone: k/1..3 %v were published, their rows kept only by Retain", rep.Pending, late.EventID, published)
	}
}
