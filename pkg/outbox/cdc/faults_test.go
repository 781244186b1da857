package cdc_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Issue 19, item 6: a slot lost while the relay was away (here dropped;
// max_slot_wal_keep_size or a failover do the same) leaves a gap of rows
// that no slot streams. In table mode the relay republishes them from the
// table by itself, before its retention deletes anything: every row
// reaches Kafka, in order, and none leaves the table unpublished.
func TestCDCLostSlotGapIsRepublishedFromTheTable(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	cfg := e.config()
	// Retention as eager as it can be: the gap's rows are old enough to go
	// at once if the relay's confirmed id passes them.
	cfg.RetentionInterval, cfg.Retain = 20*time.Millisecond, time.Nanosecond
	e.loseSlot(t, cfg, enqueue)
	// The gap: committed while no slot exists.
	enqueue(t, pool, newEvent("a", 2), newEvent("a", 3))
	enqueue(t, pool, newEvent("gap", 1))

	relay := newCDC(t, pool, e.W, cfg)
	runCDC(t, relay)
	testenv.WaitFor(t, 30*time.Second, "the new slot to stream", func() (bool, error) { return relay.Active(), nil })
	// A newer event, whose acknowledgement raises the confirmed id past the
	// whole gap.
	enqueue(t, pool, newEvent("b", 1))
	testenv.WaitFor(t, 30*time.Second, "every event, the gap's included, to reach Kafka", func() (bool, error) {
		return c.Distinct() == 5, nil
	})
	c.CheckOrder(t, map[string]int64{"a": 3, "gap": 1, "b": 1})
	// Retention still works once the gap is published.
	testenv.WaitFor(t, 20*time.Second, "retention to delete the published rows", func() (bool, error) {
		return countRows(t, pool, "true") == 0, nil
	})
}

// Issue 20's nemesis (cdc mode, SEED=170108): with several relays on one
// slot, the one that replaces a lost slot may freeze right after creating
// it, and another relay takes the new slot meanwhile. The rows committed
// while no slot existed (the gap) must still reach Kafka before the new
// slot's stream: whoever streams the new slot republishes the gap first.
// Before the fix the other relay streamed a/3 at once and the frozen
// creator, once thawed, republished a/2 after it.
func TestCDCLostSlotCreatorFrozenBeforeItStreamsKeepsTheGapFirst(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	cfg := e.config()
	cfg.OutageBackoffMin, cfg.OutageBackoffMax = 20*time.Millisecond, 200*time.Millisecond
	e.loseSlot(t, cfg, enqueue)
	enqueue(t, pool, newEvent("a", 2)) // the gap: no slot exists

	frozen, thaw := make(chan struct{}), make(chan struct{})
	var freezeOnce, thawOnce sync.Once
	freeze := func(name string) error {
		if name == outboxtest.CrashAfterSlotCreated {
			freezeOnce.Do(func() { close(frozen); <-thaw })
		}
		return nil
	}
	thawCreator := func() { thawOnce.Do(func() { close(thaw) }) }
	creator := newCDC(t, pool, e.W, cfg)
	testenv.RunInBackground(t, "the creator's Run", func(ctx context.Context) error {
		return creator.Run(outboxtest.WithCrashPoint(ctx, freeze))
	})
	t.Cleanup(thawCreator) // before the creator's Run is stopped (cleanups run last first)
	select {
	case <-frozen:
	case <-time.After(30 * time.Second):
		t.Fatal("the creator did not create the new slot within 30s")
	}
	enqueue(t, pool, newEvent("a", 3)) // in the new slot's stream

	other := newCDC(t, pool, e.W, cfg)
	runCDC(t, other)
	testenv.WaitFor(t, 30*time.Second, "the other relay to take the new slot", func() (bool, error) { return other.Active(), nil })
	testenv.WaitFor(t, 30*time.Second, "a/3 to reach Kafka", func() (bool, error) { return c.Distinct() >= 2, nil })
	thawCreator()
	testenv.WaitFor(t, 30*time.Second, "every event to reach Kafka", func() (bool, error) { return c.Distinct() == 3, nil })
	c.CheckOrder(t, map[string]int64{"a": 3})
}

// Issue 19, item 9: a topic whose writes fail (here it does not exist and
// the broker does not create topics) holds back its own events only; the
// other topics' events keep flowing, as with the polling relay. Once the
// topic exists its events follow, and the slot confirms past all of them.
func TestCDCOneFailingTopicDoesNotStopTheOthers(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	missing := testenv.Name("missing")
	cfg := e.config()
	cfg.OutageBackoffMax = 200 * time.Millisecond
	cfg.Topic = func(aggType string) string {
		if aggType == "broken" {
			return missing
		}
		return e.Topic
	}
	runStreaming(t, newCDC(t, pool, e.W, cfg))

	bad := newEvent("b-1", 1)
	bad.AggregateType = "broken"
	enqueue(t, pool, bad)
	for v := int64(1); v <= 3; v++ {
		enqueue(t, pool, newEvent("fine", v))
	}
	testenv.WaitFor(t, 30*time.Second, "the healthy topic's events while the other topic fails", func() (bool, error) {
		return c.Distinct() == 3, nil
	})
	c.CheckOrder(t, map[string]int64{"fine": 3})

	committed := currentLSN(t, pool)
	if got := confirmedLSN(t, pool, e.slot); got >= committed {
		t.Fatalf("slot confirmed %s, past the unpublished event of the failing topic (before %s)", got, committed)
	}
	testenv.NewTopicNamed(t, e.Brokers, missing, 1)
	late := collect(t, e.Brokers, missing)
	testenv.WaitFor(t, 60*time.Second, "the failing topic's event once the topic exists", func() (bool, error) {
		return late.Distinct() == 1, nil
	})
	testenv.WaitFor(t, 20*time.Second, "the slot to confirm past every event", func() (bool, error) {
		return confirmedLSN(t, pool, e.slot) >= committed, nil
	})
}

// Issue 19, item 8: a message under the outbox's prefix that is not a valid
// envelope (emitted by hand: pg_logical_emit_message is a plain function)
// is refused: counted dead with its reason, never published, and the
// stream goes on with the events after it.
func TestCDCInvalidEmittedMessageGoesDead(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	reg := prometheus.NewRegistry()
	cfg := e.config()
	cfg.Metrics = outbox.NewMetrics(reg)
	logs := &testenv.LogBuffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	runStreaming(t, newCDC(t, pool, e.W, cfg))

	forge := func(content string) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), `SELECT pg_logical_emit_message(true, $1, $2::text)`, cdc.EmitPrefix, content); err != nil {
			t.Fatal(err)
		}
	}
	forge(`not json at all`)
	// JSON, but no event id, no aggregate: a PaymentCaptured nobody wrote.
	forge(`{"eventType":"PaymentCaptured","eventVersion":1,"payload":{"amount":100}}`)
	emit(t, pool, newEvent("a", 1))
	testenv.WaitFor(t, 30*time.Second, "the valid event after the invalid ones", func() (bool, error) { return c.Distinct() == 1, nil })
	testenv.WaitFor(t, 10*time.Second, "both invalid messages counted dead", func() (bool, error) {
		return testenv.MetricValue(t, reg, "outbox_dead_total") == 2, nil
	})
	for _, reason := range []string{"undecodable", "invalid"} {
		if v := testenv.LabeledMetricValue(t, reg, "outbox_emitted_refused_total", map[string]string{"reason": reason}); v != 1 {
			t.Errorf("outbox_emitted_refused_total{reason=%q} = %v, want 1", reason, v)
		}
	}
	if !strings.Contains(logs.String(), "PaymentCaptured") {
		t.Errorf("the refusal's log does not show the refused content:\n%s", logs)
	}
	if n := c.Distinct() + c.Dups(); n != 1 {
		t.Errorf("%d messages on the topic, want only the valid one", n)
	}
}

// Issue 19, item 10: in the log-based modes the relay keeps
// outbox_dead_events current, so the OutboxDeadEvents alert can fire.
func TestCDCRelayRefreshesTheDeadGauge(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 10)
	reg := prometheus.NewRegistry()
	cfg := e.config()
	cfg.MaxAttempts, cfg.BackoffMin, cfg.Metrics = 1, 10*time.Millisecond, outbox.NewMetrics(reg)
	cfg.LagInterval = 50 * time.Millisecond
	runStreaming(t, newCDC(t, e.Pool, e.W, cfg))

	big := newEvent("big", 1)
	big.Payload = []byte(`{"blob":"` + strings.Repeat("x", 1200<<10) + `"}`) // kafka-go's writer stops at 1 MiB
	enqueue(t, e.Pool, big)
	testenv.WaitFor(t, 30*time.Second, "the row to be marked dead", func() (bool, error) {
		return countRows(t, e.Pool, "state = 'dead'") == 1, nil
	})
	testenv.WaitFor(t, 20*time.Second, "outbox_dead_events to show the dead row", func() (bool, error) {
		return testenv.MetricValue(t, reg, "outbox_dead_events") == 1, nil
	})
}

// Issue 19, item 6: in WAL-only mode a lost slot's window cannot be
// republished (Emit wrote no row); the loss is loud: counted in
// outbox_slot_lost_unrecoverable_total and logged with the LSN range, which
// holds the lost event's commit.
func TestCDCLostSlotInWALModeIsLoud(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	reg := prometheus.NewRegistry()
	logs := &testenv.LogBuffer{}
	cfg := e.config()
	cfg.Mode, cfg.Metrics, cfg.Logger = outbox.ModeWAL, outbox.NewMetrics(reg), slog.New(slog.NewJSONHandler(logs, nil))
	// As loseSlot, with "a"/2 emitted while the relay is stopped: in the
	// WAL only, then in no slot's stream once the slot is gone. (Emitted
	// after, it is refused: Emit takes no write while no slot holds it.)
	stop := runStreaming(t, newCDC(t, pool, e.W, cfg))
	emit(t, pool, newEvent("a", 1))
	testenv.WaitFor(t, 20*time.Second, "the first event", func() (bool, error) { return c.Distinct() == 1, nil })
	stop()
	emit(t, pool, newEvent("a", 2))
	lostAt := currentLSN(t, pool)
	testenv.WaitFor(t, 20*time.Second, "the slot to be dropped", func() (bool, error) {
		_, err := pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, e.slot)
		return err == nil, nil // 55006 while the walsender is still going away
	})

	relay := newCDC(t, pool, e.W, cfg)
	runCDC(t, relay)
	testenv.WaitFor(t, 30*time.Second, "the unrecoverable loss to be counted", func() (bool, error) {
		return testenv.MetricValue(t, reg, "outbox_slot_lost_unrecoverable_total") == 1, nil
	})
	rec, ok := logs.Record("REPLICATION SLOT LOST, WAL-ONLY EVENTS LOST: replaced it with a new one; every event Emit wrote " +
		"between last_confirmed_lsn and new_slot_lsn that Kafka had not acknowledged is lost and cannot be republished: " +
		"reconcile from the domain tables (see the runbook)")
	if !ok {
		t.Fatalf("no log record of the WAL-only loss:\n%s", logs)
	}
	from, err := pglogrepl.ParseLSN(fmt.Sprint(rec["last_confirmed_lsn"]))
	if err != nil {
		t.Fatal(err)
	}
	to, err := pglogrepl.ParseLSN(fmt.Sprint(rec["new_slot_lsn"]))
	if err != nil {
		t.Fatal(err)
	}
	if !(from < lostAt && lostAt <= to) {
		t.Errorf("logged range %s..%s does not hold the lost event's commit (%s)", from, to, lostAt)
	}
	testenv.WaitFor(t, 20*time.Second, "the new slot to stream", func() (bool, error) { return relay.Active(), nil })
	emit(t, pool, newEvent("b", 1))
	testenv.WaitFor(t, 20*time.Second, "events after the new slot", func() (bool, error) { return c.Distinct() == 2, nil })
}

// Issue 19, item 6: the relay exports the WAL its slot retains and the
// server's max_slot_wal_keep_size, so an alert (OutboxSlotNearInvalidation)
// fires well before Postgres invalidates the slot.
func TestCDCSlotGaugesShowRetainedWALAgainstTheKeepSize(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	reg := prometheus.NewRegistry()
	cfg := e.config()
	cfg.Metrics, cfg.LagInterval = outbox.NewMetrics(reg), 50*time.Millisecond
	var keepMB int64
	if err := e.Pool.QueryRow(context.Background(),
		`SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'`).Scan(&keepMB); err != nil {
		t.Fatal(err)
	}
	if keepMB <= 0 {
		t.Fatalf("max_slot_wal_keep_size is unlimited on this server; the dev stack sets 2GB (devstack/stack.sh): start it with `make up`")
	}
	runStreaming(t, newCDC(t, e.Pool, e.W, cfg))
	testenv.WaitFor(t, 20*time.Second, "the slot gauges", func() (bool, error) {
		return testenv.MetricValue(t, reg, "outbox_slot_wal_keep_size_bytes") == float64(keepMB<<20) &&
			testenv.MetricValue(t, reg, "outbox_slot_retained_wal_bytes") > 0, nil
	})
}

// Issue 19, item 6, the schedule of a real loss: the relay runs, Kafka is
// away, events wait in the relay unacknowledged, and the slot is lost under
// it (here its walsender is killed and the slot dropped; Postgres
// invalidating it does the same). The relay replaces the slot while Kafka
// is still away, and once Kafka is back every event reaches it, in order,
// and retention deletes nothing unpublished.
func TestCDCSlotLostDuringAKafkaOutageLosesNothing(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	pool, slot, c := e.Pool, e.slot, e.C
	down := testenv.NewWriter([]string{testenv.ClosedAddr(t)}, 100)
	t.Cleanup(func() { down.Close() })
	sw := &switchWriter{}
	sw.Current.Store(down)
	reg := prometheus.NewRegistry()
	cfg := e.config()
	cfg.Metrics = outbox.NewMetrics(reg)
	cfg.RetentionInterval, cfg.Retain = 20*time.Millisecond, time.Nanosecond
	// Slow to reconnect, so the test can drop the slot between two tries.
	cfg.OutageBackoffMin, cfg.OutageBackoffMax = time.Second, 2*time.Second
	runStreaming(t, newCDC(t, pool, sw, cfg))

	enqueue(t, pool, newEvent("a", 1), newEvent("a", 2))
	testenv.WaitFor(t, 20*time.Second, "writes to fail a few times", func() (bool, error) { return sw.Writes.Load() >= 3, nil })
	testenv.WaitFor(t, 20*time.Second, "the slot to be dropped under the relay", func() (bool, error) {
		_, err := pool.Exec(context.Background(), `
SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		if err != nil {
			return false, err
		}
		_, err = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot)
		return err == nil, nil // 55006 while the walsender is still going away
	})
	testenv.WaitFor(t, 30*time.Second, "the relay to replace the lost slot", func() (bool, error) {
		return testenv.MetricValue(t, reg, "outbox_slot_lost_total") == 1, nil
	})
	enqueue(t, pool, newEvent("a", 3))
	// Ten retention passes: a wrongly deleted row would be gone.
	testenv.HoldsFor(t, 200*time.Millisecond, "retention keeps all 3 unpublished rows while Kafka is away", func() (bool, error) {
		return countRows(t, pool, "true") == 3, nil
	})

	sw.Current.Store(e.W)
	testenv.WaitFor(t, 60*time.Second, "every event once Kafka is back", func() (bool, error) { return c.Distinct() == 3, nil })
	c.CheckOrder(t, map[string]int64{"a": 3})
	testenv.WaitFor(t, 20*time.Second, "retention to delete the published rows", func() (bool, error) {
		return countRows(t, pool, "true") == 0, nil
	})
}

// Issue 32: a lost slot (here dropped; a PostgreSQL 15 failover loses it
// the same way) used to be replayed from the whole table, every row that
// retention had not deleted yet: all the retained, long-published rows went
// to Kafka a second time. The replay republishes the gap, the rows no slot
// confirmed (publishedCDC, commit-ordered), and nothing the old slot had
// already confirmed.
func TestCDCLostSlotReplaysOnlyTheGapNotWhatWasPublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newCDCEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	cfg := e.config()
	// Retention runs often but keeps every row: the published rows are in
	// the table when the slot is lost, as with a production Retain.
	cfg.RetentionInterval, cfg.Retain = 20*time.Millisecond, time.Hour
	stop := runStreaming(t, newCDC(t, pool, e.W, cfg))
	enqueue(t, pool, newEvent("p", 1), newEvent("p", 2), newEvent("p", 3))
	testenv.WaitFor(t, 20*time.Second, "the published events", func() (bool, error) { return c.Distinct() == 3, nil })
	testenv.WaitFor(t, 30*time.Second, "the relay to count them published (its horizon past them)", func() (bool, error) {
		r, err := outboxadmin.Backlog(ctx, pool, outboxadmin.BacklogConfig{})
		return r.Pending.Count == 0, err
	})
	stop()
	testenv.WaitFor(t, 20*time.Second, "the slot to be dropped", func() (bool, error) {
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, e.slot)
		return err == nil, nil // 55006 while the walsender is still going away
	})
	enqueue(t, pool, newEvent("gap", 1))

	runStreaming(t, newCDC(t, pool, e.W, cfg))
	enqueue(t, pool, newEvent("b", 1))
	testenv.WaitFor(t, 30*time.Second, "the gap and the next event to reach Kafka", func() (bool, error) {
		return c.Distinct() == 5, nil
	})
	if n := c.Dups(); n != 0 {
		t.Errorf("the lost slot's replay sent %d event(s) a second time: it replayed rows the old slot had confirmed, not only the gap", n)
	}
	if n := countRows(t, pool, "true"); n != 5 {
		t.Errorf("%d rows in the table, want all 5 (Retain is an hour)", n)
	}
}

// pageGate is a Writer that, on its first call, runs between once before
// it publishes: the gap replay's first page is then read and the second not
// yet.
type pageGate struct {
	outbox.Writer
	once    sync.Once
	between func()
}

func (g *pageGate) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	g.once.Do(g.between)
	return g.Writer.WriteMessages(ctx, msgs...)
}

// The make prove nemesis (cdc, SEED=515398) found billing's PaymentRefunded
// v2 on the topic before its PaymentCaptured v1: a lost slot's replay read
// the table a page at a time, each page its own snapshot. Ids are drawn at
// INSERT, not at commit: v1's row had an id the replay's first page had
// already passed while its transaction was still open, and v2, committed
// after it with a higher id, was on a later page. The replay published v2;
// v1 came only with the stream, after it. One snapshot for the whole
// replay sees v1 whenever it sees v2.
func TestCDCGapReplaySeesAnAggregateCommittedDuringItWhole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newCDCEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	cfg := e.config()
	cfg.MaxInFlight = 2 // pages of two rows
	e.loseSlot(t, cfg, enqueue)

	var txX pgx.Tx
	x1, x2 := newEvent("x", 1), newEvent("x", 2)
	// Once the new slot exists (a transaction open across its creation
	// would hold that up), x/1 takes an id and stays uncommitted while
	// higher ids commit: the replay's first page passes x/1's id unseen.
	opened := func(name string) error {
		if name != outboxtest.CrashAfterSlotCreated || txX != nil {
			return nil
		}
		var err error
		if txX, err = pool.Begin(ctx); err != nil {
			return err
		}
		if err := outbox.Enqueue(ctx, txX, x1); err != nil {
			return err
		}
		enqueue(t, pool, newEvent("f", 1), newEvent("f", 2), newEvent("f", 3))
		return nil
	}
	gate := &pageGate{Writer: e.W, between: func() {
		// x/1 commits, then x/2 after it: both before the second page.
		if err := txX.Commit(ctx); err != nil {
			t.Error(err)
		}
		enqueue(t, pool, x2)
	}}
	relay := newCDC(t, pool, gate, cfg)
	testenv.RunInBackground(t, "Run", func(ctx context.Context) error {
		return relay.Run(outboxtest.WithCrashPoint(ctx, opened))
	})
	testenv.WaitFor(t, 30*time.Second, "x/1 and x/2 to reach Kafka", func() (bool, error) {
		return c.Has(x1.EventID) && c.Has(x2.EventID), nil
	})
	c.CheckOrder(t, map[string]int64{"x": 2, "f": 3})
}

// The slot record (outbox_cdc_slots) is written beside the stream, best
// effort: a write that cannot get through (its row locked by a retention
// waiting for a synchronous standby, a slow database) must not stop the
// stream. Before the fix a failed record was tried again with every status
// update, each taking the whole StatusInterval, after which the read
// deadline had passed already: the stream never read another message.
func TestCDCStreamGoesOnWhileItsSlotRecordIsLocked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newCDCEnv(t, 1, 10)
	cfg := e.config()
	reg := prometheus.NewRegistry()
	cfg.Metrics = outbox.NewMetrics(reg)
	cfg.RetentionInterval = 50 * time.Millisecond
	runStreaming(t, newCDC(t, e.Pool, e.W, cfg))
	enqueue(t, e.Pool, newEvent("a", 1))
	testenv.WaitFor(t, 20*time.Second, "a/1 published", func() (bool, error) { return e.C.Distinct() == 1, nil })

	lock, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // only a lock
	if _, err := lock.Exec(ctx, `SELECT 1 FROM outbox_cdc_slots WHERE slot_name = $1 FOR UPDATE`, e.slot); err != nil {
		t.Fatal(err)
	}
	// One at a time: each a/v is written only once the relay tried to
	// record a/v-1's position and could not.
	failedRecords := func() float64 {
		return testenv.LabeledMetricValue(t, reg, "outbox_db_errors_total", map[string]string{"op": "slot"})
	}
	for v := int64(2); v <= 5; v++ {
		enqueue(t, e.Pool, newEvent("a", v))
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("a/%d published while the slot record stays locked", v), func() (bool, error) {
			return e.C.Distinct() == int(v), nil
		})
		failed := failedRecords()
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("a/%d's position recorded, and failing", v), func() (bool, error) {
			return failedRecords() > failed, nil
		})
	}
	e.C.CheckOrder(t, map[string]int64{"a": 5})
}
