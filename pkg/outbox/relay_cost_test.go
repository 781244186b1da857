package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// At a low rate, one event per transaction costs the relay one claim and
// two round trips to Postgres (the claim's pipeline, then the marks and the
// commit): it stays armed between commits instead of disarming, claiming
// until empty, re-arming and claiming again. The round trips are counted on
// the relay's sockets, so the test does not take the relay's word for it;
// the relay's own counters must agree.
func TestAnArmedRelayPaysOneClaimAndTwoRoundTripsPerCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRelayEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	relayPool, counts := e.CountingPool(t)
	reg := prometheus.NewRegistry()
	relay, err := outbox.NewRelay(relayPool, e.W, outbox.RelayConfig{
		ID: "frugal", Topic: e.TopicFn, Metrics: outbox.NewMetrics(reg),
		// No poll, heartbeat or gauge refresh during the test: only commits
		// make the relay talk to Postgres.
		PollInterval: time.Hour, RebalanceInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay)
	testenv.WaitFor(t, 10*time.Second, "the idle relay to arm its wake-up", func() (bool, error) {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(waiting), false) FROM outbox_relays WHERE id = 'frugal'`).Scan(&waiting)
		return waiting, err
	})
	// The first commit prepares the relay's statements on its connection;
	// count from the second.
	enqueue(t, pool, newEvent("warm-up", 1))
	testenv.WaitFor(t, 10*time.Second, "the warm-up event to be published", func() (bool, error) {
		return countRows(t, pool, "state = 'published'") == 1, nil
	})

	before := counts.Snapshot()
	claimsBefore := testenv.MetricValue(t, reg, "outbox_relay_claims_total")
	rtBefore := testenv.MetricValue(t, reg, "outbox_relay_db_roundtrips_total")
	const commits = 20
	for i := range commits {
		enqueue(t, pool, newEvent(fmt.Sprintf("agg-%d", i), 1))
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("commit %d to be published and marked", i+1), func() (bool, error) {
			return countRows(t, pool, "state = 'published'") == i+2, nil
		})
	}
	d := counts.Snapshot().Minus(before)
	claims := testenv.MetricValue(t, reg, "outbox_relay_claims_total") - claimsBefore
	roundTrips := testenv.MetricValue(t, reg, "outbox_relay_db_roundtrips_total") - rtBefore
	t.Logf("%d commits: %d claims, %d round trips, %d statements on the wire; the relay counted %.0f claims, %.0f round trips",
		commits, d.Claims, d.RoundTrips, d.Statements, claims, roundTrips)
	// A notification that arrives while the relay finishes a batch costs
	// one empty claim; allow two of them.
	if d.Claims > commits+2 {
		t.Errorf("%d claims for %d commits, want at most one each (+2)", d.Claims, commits)
	}
	if d.RoundTrips > 2*(commits+2) {
		t.Errorf("%d round trips for %d commits, want at most two each (+4)", d.RoundTrips, commits)
	}
	// The relay does not count pgx preparing its statements on a
	// connection it had not used yet: one round trip per pipeline, rare.
	if prepares := float64(d.RoundTrips) - roundTrips; claims != float64(d.Claims) || prepares < 0 || prepares > 4 {
		t.Errorf("the relay counted %.0f claims and %.0f round trips; its sockets saw %d and %d",
			claims, roundTrips, d.Claims, d.RoundTrips)
	}
	if got := c.Distinct(); got > commits+1 {
		t.Errorf("%d events on the topic, want at most %d", got, commits+1)
	}
}

// A row the relay cannot make into a message (its headers column does not
// decode) is a message error like any other: charged an attempt each try,
// dead after MaxAttempts with the reason, and holding back its aggregate's
// later rows meanwhile, while other aggregates flow. It used to fail the
// whole claim, every time, forever.
func TestAnUndecodableRowIsChargedThenDeadAndHoldsBackItsAggregate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newRelayEnv(t, 1, 50)
	pool, c := e.Pool, e.C

	enqueue(t, pool, newEvent("bad", 1))
	if _, err := pool.Exec(ctx, `UPDATE outbox_events SET headers = '"not an object"' WHERE aggregate_id = 'bad'`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, newEvent("bad", 2), newEvent("good", 1))

	const maxAttempts = 3
	relay, err := outbox.NewRelay(pool, e.W, outbox.RelayConfig{
		Topic: e.TopicFn, MaxAttempts: maxAttempts,
		BackoffMin: time.Millisecond, BackoffMax: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	testenv.WaitFor(t, 20*time.Second, "the undecodable row to go dead", func() (bool, error) {
		if _, err := relay.RelayBatch(ctx); err != nil {
			return false, fmt.Errorf("a batch failed instead of charging the row: %w", err)
		}
		return countRows(t, pool, "state = 'dead'") == 1, nil
	})
	var (
		attempts  int
		lastError string
	)
	if err := pool.QueryRow(ctx, `SELECT attempts, last_error FROM outbox_events WHERE state = 'dead'`).Scan(&attempts, &lastError); err != nil {
		t.Fatal(err)
	}
	if attempts != maxAttempts || !strings.Contains(lastError, publish.ErrUndecodable.Error()) {
		t.Errorf("dead row: %d attempts, last error %q; want %d and the reason", attempts, lastError, maxAttempts)
	}
	if n := countRows(t, pool, "aggregate_id = 'bad' AND aggregate_version = 2 AND state = 'pending' AND attempts = 0"); n != 1 {
		t.Error("the dead row's later event was published or charged; it must wait, untouched, for a requeue")
	}
	if n := countRows(t, pool, "aggregate_id = 'good' AND state = 'published'"); n != 1 {
		t.Error("another aggregate's event was held back by the undecodable row")
	}
	testenv.WaitFor(t, 10*time.Second, "the good event on the topic", func() (bool, error) { return c.Distinct() >= 1, nil })
	c.CheckOrder(t, map[string]int64{"good": 1, "bad": 0})
}

// A relay whose registration vanished (another relay took it for dead and
// deleted it) is unarmed once its heartbeat registers it again; it must arm
// again at once, not at its next poll, or commits would wait for that poll.
func TestARelayReArmsWhenItsRegistrationIsRecreated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRelayEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	relay, err := outbox.NewRelay(pool, e.W, outbox.RelayConfig{
		ID: "phoenix", Topic: e.TopicFn,
		PollInterval: time.Hour, RebalanceInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay)
	armed := func() (bool, error) {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(waiting), false) FROM outbox_relays WHERE id = 'phoenix'`).Scan(&waiting)
		return waiting, err
	}
	testenv.WaitFor(t, 10*time.Second, "the idle relay to arm its wake-up", armed)
	if _, err := pool.Exec(ctx, `DELETE FROM outbox_relays WHERE id = 'phoenix'`); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the relay to register and arm again (an hourly poll would be too late)", armed)
	enqueue(t, pool, newEvent("after", 1))
	testenv.WaitFor(t, 5*time.Second, "the commit after re-registration to be published", func() (bool, error) {
		return c.Distinct() == 1, nil
	})
}

// A busy relay does not arm between its writers' commits. Arming takes the
// wake fence exclusively (arm), and PostgreSQL queues every writer's
// shared request behind it until the arming transaction ends, so a relay
// that armed at each empty claim held every writer's commit several times
// a second (at 600 orders/s on the dev stack: 1.5 ms of lock wait per
// order). Writers commit here about 500 times a second, five events each
// (so that a loaded machine still writes far above busyRate), for two
// seconds; a trigger counts the relay's arms (waiting: false → true).
func TestABusyRelayDoesNotArmBetweenCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRelayEnv(t, 1, 50)
	pool := e.Pool
	for _, sql := range []string{
		`CREATE TABLE relay_arms (at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`CREATE FUNCTION count_arm() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN INSERT INTO relay_arms DEFAULT VALUES; RETURN NEW; END $$`,
		`CREATE TRIGGER count_arm AFTER UPDATE OF waiting ON outbox_relays
		 FOR EACH ROW WHEN (NEW.waiting AND NOT OLD.waiting) EXECUTE FUNCTION count_arm()`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	relay, err := outbox.NewRelay(pool, e.W, outbox.RelayConfig{ID: "busy", Topic: e.TopicFn, PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay)
	testenv.WaitFor(t, 10*time.Second, "the idle relay to arm its wake-up", func() (bool, error) {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(waiting), false) FROM outbox_relays WHERE id = 'busy'`).Scan(&waiting)
		return waiting, err
	})

	const writers, every, load = 4, 8 * time.Millisecond, 2 * time.Second // 4 / 8 ms = 500 commits/s
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			tick := time.NewTicker(every)
			defer tick.Stop()
			for i := 0; time.Since(start) < load; i++ {
				<-tick.C
				evs := make([]event.Envelope, 5)
				for j := range evs {
					evs[j] = newEvent(fmt.Sprintf("w%d-%d-%d", w, i, j), 1)
				}
				enqueue(t, pool, evs...)
			}
		})
	}
	wg.Wait()
	var committed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&committed); err != nil {
		t.Fatal(err)
	}
	// The first half second is the relay finding out it is busy; count the
	// arms after it, while the writers still wrote.
	var arms int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_arms WHERE at > $1 AND at < $2`,
		start.Add(load/4), start.Add(load)).Scan(&arms); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events in %v from %d writers; the relay armed %d times while they wrote", committed, load, writers, arms)
	if rate := float64(committed) / load.Seconds(); rate < 400 {
		t.Fatalf("the writers managed %.0f events/s, too few for a busy relay (want ≥ 400, twice busyRate)", rate)
	}
	if arms > 2 {
		t.Errorf("a busy relay armed %d times in %v between commits, want at most 2: each arm holds every writer's commit at the wake fence", arms, load*3/4)
	}
}
