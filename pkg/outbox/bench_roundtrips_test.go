package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// BenchmarkRelayRoundTrips measures what the polling relay costs Postgres
// per event when each transaction writes one event, at a fixed offered rate
// (an open loop of single-event commits) for a few seconds, with the relay
// running as in production (Run, woken by LISTEN/NOTIFY):
//
//   - claims/event: claim statements per published event (a pgx tracer on
//     the relay's pool counts them, whatever the relay's version);
//   - wire-rt/event: round trips to Postgres per event, counted on the
//     relay's sockets (a write after a read starts one), so heartbeats,
//     gauges and the lock connection count too;
//   - stmts/event: SQL statements per event, pipelined or not;
//   - metric-rt/event and metric-claims/event: the same from the relay's own
//     counters (outbox_relay_db_roundtrips_total, outbox_relay_claims_total),
//     which is what the platform's /metrics shows;
//   - ack-p50-ms, ack-p99-ms: commit → broker acknowledgement, to show that
//     fewer round trips did not cost latency (Linger adds to it; linger=off sets it to 1ns, which never lingers);
//   - armed-share: the share of the load during which the relay was armed,
//     so that writers' commits notified (a busy relay should not be);
//   - idle-claims/s, idle-rt/s: the same counts over an idle window after.
//
// Round trips and claims are counts, not times: they do not depend on how
// busy the shared machine is, so one short run compares versions.
func BenchmarkRelayRoundTrips(b *testing.B) {
	for _, c := range []struct {
		name   string
		rate   int
		linger time.Duration
	}{
		{"rate=100", 100, 0},
		{"rate=300", 300, 0},
		{"rate=1000", 1000, 0},
		{"rate=100/linger=off", 100, time.Nanosecond},
		{"rate=300/linger=off", 300, time.Nanosecond},
		{"rate=1000/linger=off", 1000, time.Nanosecond},
		{"rate=300/linger=2ms", 300, 2 * time.Millisecond},
		{"rate=1000/linger=2ms", 1000, 2 * time.Millisecond},
	} {
		b.Run(c.name, func(b *testing.B) { benchRelayRoundTrips(b, c.rate, c.linger) })
	}
}

const (
	rtLoad = 4 * time.Second
	rtIdle = 2 * time.Second
)

func benchRelayRoundTrips(b *testing.B, rate int, linger time.Duration) {
	ctx := context.Background()
	brokers := testenv.KafkaBrokers(b)
	topic := testenv.NewTopic(b, brokers, 6)
	dbURL := testenv.NewDatabase(b)
	pool := benchPool(b, dbURL, lagProducers+1, "on", nil)
	benchMigrate(b, pool)
	counts := &benchWireCounts{}
	relayPool := benchCountingPool(b, dbURL, 4, counts)

	acked := newBenchClock()
	w := testenv.NewWriter(brokers, 500)
	defer benchCloseWriter(w)
	reg := prometheus.NewRegistry()
	aw := &benchAckWriter{benchTimedWriter: benchTimedWriter{w: w, phases: newBenchPhases()}, acked: acked}
	relay, err := outbox.NewRelay(relayPool, aw, outbox.RelayConfig{
		Topic:   func(string) string { return topic },
		Metrics: outbox.NewMetrics(reg),
		Logger:  benchLogger,
		Linger:  linger,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer testenv.RunInBackground(b, "relay.Run", relay.Run)()

	var (
		events, claims, wire, stmts   float64
		metricRT, metricClaims        float64
		idleClaims, idleWire, idleFor float64
		ackLag                        []time.Duration
		armedSamples, samples         int
	)
	for range b.N {
		warm, err := benchTrickle(ctx, pool, outbox.Enqueue, rate, rate/2, newBenchClock())
		if err != nil {
			b.Fatal(err)
		}
		waitPublished := func(ids []string) {
			testenv.WaitFor(b, 30*time.Second, "every event to be acked and marked published", func() (bool, error) {
				var unpublished int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE state <> 'published'`).Scan(&unpublished)
				return acked.HasAll(ids) && unpublished == 0, err
			})
		}
		waitPublished(warm)

		before, rtBefore, claimsBefore := counts.Snapshot(), benchCounterSum(reg, "outbox_relay_db_roundtrips_total"), benchCounterSum(reg, "outbox_relay_claims_total")
		committed := newBenchClock()
		sampleCtx, stopSampling := context.WithCancel(ctx)
		sampled := make(chan [2]int, 1)
		go func() { sampled <- benchSampleArmed(sampleCtx, pool) }()
		ids, err := benchTrickle(ctx, pool, outbox.Enqueue, rate, int(rtLoad.Seconds()*float64(rate)), committed)
		stopSampling()
		armed := <-sampled
		if err != nil {
			b.Fatal(err)
		}
		armedSamples, samples = armedSamples+armed[0], samples+armed[1]
		waitPublished(ids)
		d := counts.Snapshot().Minus(before)
		events += float64(len(ids))
		claims, wire, stmts = claims+float64(d.Claims), wire+float64(d.RoundTrips), stmts+float64(d.Statements)
		metricRT += benchCounterSum(reg, "outbox_relay_db_roundtrips_total") - rtBefore
		metricClaims += benchCounterSum(reg, "outbox_relay_claims_total") - claimsBefore
		ackLag = append(ackLag, committed.LagsUntil(acked, ids)...)

		before = counts.Snapshot()
		<-time.After(rtIdle) // the idle window itself, not a wait for a condition
		d = counts.Snapshot().Minus(before)
		idleClaims, idleWire, idleFor = idleClaims+float64(d.Claims), idleWire+float64(d.RoundTrips), idleFor+rtIdle.Seconds()
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(claims/events, "claims/event")
	b.ReportMetric(wire/events, "wire-rt/event")
	b.ReportMetric(stmts/events, "stmts/event")
	b.ReportMetric(metricRT/events, "metric-rt/event")
	b.ReportMetric(metricClaims/events, "metric-claims/event")
	b.ReportMetric(benchMillis(benchPercentile(ackLag, 0.50)), "ack-p50-ms")
	b.ReportMetric(benchMillis(benchPercentile(ackLag, 0.99)), "ack-p99-ms")
	b.ReportMetric(float64(armedSamples)/float64(max(samples, 1)), "armed-share")
	b.ReportMetric(idleClaims/idleFor, "idle-claims/s")
	b.ReportMetric(idleWire/idleFor, "idle-rt/s")
}

// benchSampleArmed samples every 10 ms, until ctx ends, whether a relay is
// armed (so that every commit notifies), and returns how many samples found
// one armed, and how many were taken.
func benchSampleArmed(ctx context.Context, pool *pgxpool.Pool) (n [2]int) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return n
		case <-tick.C:
		}
		var armed bool
		if err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(waiting), false) FROM outbox_relays`).Scan(&armed); err != nil {
			continue // ctx ended mid-query
		}
		n[1]++
		if armed {
			n[0]++
		}
	}
}

// benchCounterSum is the sum of a counter's series in g, 0 if it is not
// there (a relay from before the counter existed).
func benchCounterSum(g prometheus.Gatherer, name string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
