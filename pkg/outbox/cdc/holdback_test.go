package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// newHoldbackCDCEnv is where the CDC holdback tests start: a cdcEnv whose
// topic is a small one (newSmallTopic), read with onTopic rather than a
// collector, and a config on it that gives up on a message after
// maxAttempts quick tries.
func newHoldbackCDCEnv(t *testing.T, maxAttempts int) (*cdcEnv, cdc.Config) {
	t.Helper()
	e := &cdcEnv{relayEnv: &relayEnv{Brokers: testenv.KafkaBrokers(t)}}
	e.Topic = newSmallTopic(t, e.Brokers)
	e.Pool = newOutboxDB(t)
	e.slot = newSlot(t, e.Pool)
	e.W = testenv.NewWriter(e.Brokers, 10)
	t.Cleanup(func() { e.W.Close() })
	cfg := e.config()
	cfg.MaxAttempts, cfg.BackoffMin, cfg.BackoffMax = maxAttempts, 20*time.Millisecond, 50*time.Millisecond
	return e, cfg
}

// In table mode a dead event holds back its aggregate's later events, as in
// the polling relay: the broker refuses big/1 (too large for the topic)
// until it goes dead; big/2, small enough, must not reach the topic ahead of
// it, in the same write or any later one, and a restarted relay keeps the
// hold. Requeueing every dead row once the topic takes big/1 publishes
// big/1 and then big/2. (The nemesis found consumers seeing OrderCancelled
// before OrderPlaced this way: billing dead-lettered the cancel, then parked
// the order behind it for good.)
func TestCDCDeadEventHoldsBackItsAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, cfg := newHoldbackCDCEnv(t, 2)
	brokers, topic, pool, w := e.Brokers, e.Topic, e.Pool, e.W
	stop := runStreaming(t, newCDC(t, pool, w, cfg))

	big1, big2 := newEvent("big", 1), newEvent("big", 2)
	big1.Payload = blob("x", bigBlob)
	enqueue(t, pool, big1, big2, newEvent("fine", 1))
	testenv.WaitFor(t, 30*time.Second, "big/1 dead and fine/1 published", func() (bool, error) {
		return countRows(t, pool, fmt.Sprintf("state = 'dead' AND event_id = '%s'", big1.EventID)) == 1 &&
			slices.Contains(onTopic(t, brokers, topic), "fine/1"), nil
	})
	// A later transaction's event of the held aggregate, after a restart.
	stop()
	stop = runStreaming(t, newCDC(t, pool, w, cfg))
	big3 := newEvent("big", 3)
	enqueue(t, pool, big3, newEvent("fine", 2))
	testenv.WaitFor(t, 30*time.Second, "fine/2 published", func() (bool, error) {
		return slices.Contains(onTopic(t, brokers, topic), "fine/2"), nil
	})
	// (fine's may come twice: a restarted relay streams again what the slot
	// had not confirmed.)
	if got := onTopic(t, brokers, topic); slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "big/") }) {
		t.Fatalf("while big/1 is dead the topic holds %v, want fine's only: a later event of its aggregate went ahead of it", got)
	}
	if n := countRows(t, pool, "state = 'dead'"); n != 3 {
		t.Fatalf("%d dead rows, want 3: big/1, and big/2 and big/3 held back behind it", n)
	}

	raiseTopicMax(t, brokers, topic)
	big1w := newWideWriter(brokers)
	defer big1w.Close()
	stop()
	runStreaming(t, newCDC(t, pool, big1w, cfg))
	if n, err := outboxadmin.RequeueDead(ctx, pool, outbox.ModeCDC, outboxadmin.DeadFilter{}); err != nil || n != 3 {
		t.Fatalf("RequeueDead = %d, %v; want 3", n, err)
	}
	// The stream may deliver fine/2's transaction again (the slot had not
	// confirmed it when the relay stopped): a duplicate, which consumers
	// absorb. big's events must come once each, in order.
	want := []string{"big/1", "big/2", "big/3"}
	bigs := func() []string {
		return slices.DeleteFunc(onTopic(t, brokers, topic), func(s string) bool { return !strings.HasPrefix(s, "big/") })
	}
	testenv.WaitFor(t, 30*time.Second, "the requeued events", func() (bool, error) {
		return len(bigs()) >= len(want), nil
	})
	if got := bigs(); !slices.Equal(got, want) {
		t.Fatalf("after the requeue the topic holds big's events %v, want %v (all: %v)", got, want, onTopic(t, brokers, topic))
	}
}

// The stream delivers again what the slot had not confirmed when a relay
// stopped. A row of that stretch that an operator requeued meanwhile
// (deleted, written again under a new id with the same event id) goes out
// once, as its copy: the relay checks the rows of the stretch before it
// publishes them, and only those (a stream past it costs no statement,
// TestCDCRelayRunsNoStatementPerCommit).
func TestCDCRedeliveredRowRequeuedMeanwhileGoesOutOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, cfg := newHoldbackCDCEnv(t, 1)
	brokers, topic, pool, slot, w := e.Brokers, e.Topic, e.Pool, e.slot, e.W
	cfg.OutageBackoffMin, cfg.OutageBackoffMax = 20*time.Millisecond, 100*time.Millisecond
	// The first relay never confirms anything: it stops after every batch,
	// as a crash would, before the slot moves.
	crash := func(name string) error {
		if name == outboxtest.CrashAfterAck {
			return errors.New("injected crash after the ack")
		}
		return nil
	}
	crashing := newCDC(t, pool, w, cfg)
	stop := testenv.RunInBackground(t, "Run", func(ctx context.Context) error {
		return crashing.Run(outboxtest.WithCrashPoint(ctx, crash))
	})
	testenv.WaitFor(t, 20*time.Second, "the relay to stream", func() (bool, error) { return crashing.Active(), nil })
	big := newEvent("big", 1)
	big.Payload = blob("x", bigBlob)
	enqueue(t, pool, big)
	testenv.WaitFor(t, 30*time.Second, "big/1 dead", func() (bool, error) {
		return countRows(t, pool, "state = 'dead'") == 1, nil
	})
	stop()

	raiseTopicMax(t, brokers, topic)
	wide := newWideWriter(brokers)
	defer wide.Close()
	if n, err := outboxadmin.RequeueDead(ctx, pool, outbox.ModeCDC, outboxadmin.DeadFilter{}); err != nil || n != 1 {
		t.Fatalf("RequeueDead = %d, %v; want 1", n, err)
	}
	requeued := currentLSN(t, pool)
	runStreaming(t, newCDC(t, pool, wide, cfg))
	testenv.WaitFor(t, 30*time.Second, "the slot to confirm past the requeue", func() (bool, error) {
		return confirmedLSN(t, pool, slot) >= requeued, nil
	})
	if got := onTopic(t, brokers, topic); !slices.Equal(got, []string{"big/1"}) {
		t.Fatalf("the topic holds %v, want big/1 once: the requeued row's original went out from the redelivered stretch too", got)
	}
}
