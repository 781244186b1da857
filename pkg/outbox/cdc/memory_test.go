package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// bigTxEvents is how many events TestCDCLargeTransactionMemoryIsBounded
// commits in its one transaction: 50,000 in the normal run (about half a
// minute), ONCEFLOW_TEST_CDC_BIG_TX_EVENTS for the long one (1000000 takes
// several minutes on a laptop, and is what issue 19 measured: 3.2 GB before
// the relay published in chunks).
func bigTxEvents(t *testing.T) int {
	t.Helper()
	s := os.Getenv("ONCEFLOW_TEST_CDC_BIG_TX_EVENTS")
	if s == "" {
		return 50_000
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("ONCEFLOW_TEST_CDC_BIG_TX_EVENTS=%q: want a positive number of events, e.g. 1000000", s)
	}
	return n
}

// bigTxHeapBound is the most the relay's heap may grow over its idle size
// while it publishes a transaction of any size: what is in flight to Kafka
// (Config.MaxInFlight events, under a kilobyte each, twice over for the
// garbage collector's headroom) and kafka-go's buffers, never the
// transaction. It grows by about 8 MiB; a relay that held the 50,000
// events would grow by more than 50 (TestCDCRelayProcessMemoryIsBounded
// bounds the resident set of a relay in a process of its own).
const bigTxHeapBound = 32 << 20

// insertBigTx commits n outbox rows in one transaction, built by Postgres
// (generate_series), so the test itself holds none of them: 100 aggregates,
// each in version order.
const insertBigTx = `
INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
                           payload, headers, occurred_at, partition)
SELECT gen_random_uuid(), 'thing', 'agg-' || (i % 100), i / 100 + 1, 'ThingHappened', 1,
       jsonb_build_object('n', i, 'pad', repeat('x', 200)), '{}', now(), 0
FROM generate_series(0, $1 - 1) AS i`

// Issue 19, item 9: a transaction's events are published in chunks as they
// are decoded, so the relay's memory does not grow with the transaction; the
// slot is confirmed past the transaction only once all of it is
// acknowledged. Not parallel: it measures the process's heap, which other
// tests' allocations would blur.
func TestCDCLargeTransactionMemoryIsBounded(t *testing.T) {
	n := bigTxEvents(t)
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 3)
	pool := newOutboxDB(t)
	slot := newSlot(t, pool)
	w := testenv.NewWriter(brokers, 500)
	t.Cleanup(func() { w.Close() })
	reg := prometheus.NewRegistry()
	cfg := cdc.Config{Slot: slot, Topic: func(string) string { return topic }, Metrics: outbox.NewMetrics(reg)}

	// The slot first, then the transaction, then the relay: it finds the
	// whole transaction waiting in the slot.
	stop := runStreaming(t, newCDC(t, pool, w, cfg))
	stop()
	start := time.Now()
	if _, err := pool.Exec(context.Background(), insertBigTx, n); err != nil {
		t.Fatal(err)
	}
	committed := currentLSN(t, pool)
	t.Logf("committed %d events in one transaction in %v", n, time.Since(start).Round(time.Millisecond))

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	sampling, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-sampling.Done():
				return
			case <-tick.C:
			}
		}
	}()

	start = time.Now()
	runCDC(t, newCDC(t, pool, w, cfg))
	testenv.WaitFor(t, time.Minute+time.Duration(n)*time.Millisecond, fmt.Sprintf("the slot to confirm past the %d-event transaction", n),
		func() (bool, error) { return confirmedLSN(t, pool, slot) >= committed, nil })
	stopSampling()
	<-sampled
	if got := testenv.MetricValue(t, reg, "outbox_published_total"); got < float64(n) {
		t.Errorf("outbox_published_total = %v, want at least %d", got, n)
	}
	grew := int64(peak.Load()) - int64(base)
	t.Logf("%d events in one transaction published in %v; heap grew by at most %.1f MiB (bound %d MiB)",
		n, time.Since(start).Round(time.Millisecond), float64(grew)/(1<<20), bigTxHeapBound>>20)
	if grew > bigTxHeapBound {
		t.Errorf("the relay's heap grew by %.1f MiB publishing one %d-event transaction, over the %d MiB bound: it holds the transaction",
			float64(grew)/(1<<20), n, bigTxHeapBound>>20)
	}
}

// Publishing a transaction in chunks must not confirm part of it: a relay
// that crashes after Kafka acknowledged some of a big transaction's chunks
// resumes before the transaction, and its successor publishes all of it
// (the chunks already acknowledged again; consumers dedupe).
func TestCDCCrashInsideABigTransactionRepublishesAllOfIt(t *testing.T) {
	t.Parallel()
	const n = 3000
	e := newCDCEnv(t, 3, 100)
	cfg := e.config()
	cfg.BatchSize, cfg.OutageBackoffMax = 100, 200*time.Millisecond
	// The crash comes after the next-to-last chunk, when the transaction's
	// commit has been decoded and its last chunk is still unacknowledged;
	// it waits a few status intervals first, so a relay that confirmed the
	// commit too early would have told the server by then.
	var acks atomic.Int64
	crash := func(name string) error {
		if name == outboxtest.CrashAfterAck && acks.Add(1) == n/100-1 {
			// Until the walsender has heard two standby status updates
			// since (newCDC's StatusInterval is 100ms).
			replies := map[time.Time]bool{}
			testenv.Eventually(10*time.Second, func() bool {
				var at *time.Time
				_ = e.Pool.QueryRow(context.Background(), `
SELECT reply_time FROM pg_stat_replication
WHERE pid = (SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1)`, cfg.Slot).Scan(&at)
				if at != nil {
					replies[*at] = true
				}
				return len(replies) >= 3
			})
			return errors.New("injected crash after the next-to-last acknowledged chunk")
		}
		return nil
	}
	relay := newCDC(t, e.Pool, e.W, cfg)
	stop := testenv.RunInBackground(t, "Run", func(ctx context.Context) error {
		return relay.Run(outboxtest.WithCrashPoint(ctx, crash))
	})
	defer stop()
	testenv.WaitFor(t, 20*time.Second, "the relay to stream", func() (bool, error) { return relay.Active(), nil })
	if _, err := e.Pool.Exec(context.Background(), insertBigTx, n); err != nil {
		t.Fatal(err)
	}
	committed := currentLSN(t, e.Pool)
	testenv.WaitFor(t, 60*time.Second, "every event of the transaction", func() (bool, error) { return e.C.Distinct() == n, nil })
	testenv.WaitFor(t, 20*time.Second, "the slot to confirm past the transaction", func() (bool, error) {
		return confirmedLSN(t, e.Pool, e.slot) >= committed, nil
	})
	if acks.Load() < n/100 {
		t.Fatalf("the crash point was reached %d times, want at least %d (the crash never happened)", acks.Load(), n/100)
	}
	if e.C.Dups() == 0 {
		t.Errorf("no event was published twice: the relay did not start the transaction again after the crash")
	}
	want := map[string]int64{}
	for i := range 100 {
		want[fmt.Sprintf("agg-%d", i)] = n / 100
	}
	e.C.CheckOrder(t, want)
}
