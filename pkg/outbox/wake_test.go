package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// notified reports whether conn (which LISTENs) receives a notification within d.
func notified(t *testing.T, conn *pgx.Conn, d time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := conn.WaitForNotification(ctx)
	switch {
	case err == nil:
		return true
	case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		return false
	default:
		t.Fatalf("waiting for a notification: %v", err)
		return false
	}
}

func TestCommitsNotifyOnlyWhileARelayWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newOutboxDB(t)
	conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN outbox_events"); err != nil {
		t.Fatal(err)
	}

	enqueue(t, pool, newEvent("a", 1))
	if notified(t, conn, 300*time.Millisecond) {
		t.Error("a commit notified although no relay was waiting")
	}

	if _, err := pool.Exec(ctx, `INSERT INTO outbox_relays (id, waiting) VALUES ('sleeper', true)`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, newEvent("a", 2), newEvent("a", 3))
	if !notified(t, conn, 5*time.Second) {
		t.Fatal("a commit did not notify while a relay was waiting")
	}

	if _, err := pool.Exec(ctx, `UPDATE outbox_relays SET waiting = false`); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		return outbox.Enqueue(ctx, tx, newEvent("a", 4))
	})
	if err != nil {
		t.Fatal(err)
	}
	if !notified(t, conn, 5*time.Second) {
		t.Error("a REPEATABLE READ commit did not notify (its snapshot may hide the flag, so it always must)")
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := outbox.Enqueue(ctx, tx, newEvent("b", 1)); err != nil {
			return err
		}
		return errors.New("roll back")
	})
	if err == nil {
		t.Fatal("the transaction should have rolled back")
	}
	if notified(t, conn, 300*time.Millisecond) {
		t.Error("a rolled-back transaction notified")
	}
}

// A relay that polls once an hour must still publish every commit at once:
// it arms its wake-up before sleeping, and the fence in arming means no
// commit can slip between its last empty claim and its sleep unnoticed.
func TestASleepingRelayIsWokenByEveryCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRelayEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	relay, err := outbox.NewRelay(pool, e.W, outbox.RelayConfig{ID: "sleeper", Topic: e.TopicFn, PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer testenv.RunInBackground(t, "Run", relay.Run)()
	armed := func() (bool, error) {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(waiting), false) FROM outbox_relays WHERE id = 'sleeper'`).Scan(&waiting)
		return waiting, err
	}
	testenv.WaitFor(t, 10*time.Second, "the idle relay to arm its wake-up", armed)

	// Rounds of one or more concurrent commits at random moments, so some
	// land while the relay is arming; each round must be published without
	// the hourly poll.
	const rounds = 60
	want := 0
	for round := 1; round <= rounds; round++ {
		writers := 1 + round%3
		var wg sync.WaitGroup
		for i := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-time.After(time.Duration(rand.IntN(3000)) * time.Microsecond)
				enqueue(t, pool, newEvent(fmt.Sprintf("r%d-w%d", round, i), 1))
			}()
		}
		wg.Wait()
		want += writers
		testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("round %d's %d commits to be published (a missed wake-up waits for the hourly poll)", round, writers),
			func() (bool, error) { return c.Distinct() == want, nil })
	}
	testenv.WaitFor(t, 10*time.Second, "the relay to re-arm once idle", armed)
}
