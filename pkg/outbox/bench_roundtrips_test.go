package outbox_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
				return acked.hasAll(ids) && unpublished == 0, err
			})
		}
		waitPublished(warm)

		before, rtBefore, claimsBefore := counts.snapshot(), benchCounterSum(reg, "outbox_relay_db_roundtrips_total"), benchCounterSum(reg, "outbox_relay_claims_total")
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
		d := counts.snapshot().minus(before)
		events += float64(len(ids))
		claims, wire, stmts = claims+float64(d.claims), wire+float64(d.roundTrips), stmts+float64(d.statements)
		metricRT += benchCounterSum(reg, "outbox_relay_db_roundtrips_total") - rtBefore
		metricClaims += benchCounterSum(reg, "outbox_relay_claims_total") - claimsBefore
		ackLag = append(ackLag, committed.lagsUntil(acked, ids)...)

		before = counts.snapshot()
		<-time.After(rtIdle) // the idle window itself, not a wait for a condition
		d = counts.snapshot().minus(before)
		idleClaims, idleWire, idleFor = idleClaims+float64(d.claims), idleWire+float64(d.roundTrips), idleFor+rtIdle.Seconds()
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

// benchCountingPool opens a pool on url whose connections count their round
// trips, statements and claims in counts; the relay's lock connection, dialed
// from the same config, counts too.
func benchCountingPool(b testing.TB, url string, maxConns int32, counts *benchWireCounts) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = maxConns
	dialer := &net.Dialer{KeepAlive: 5 * time.Minute}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &benchCountingConn{Conn: c, counts: counts}, nil
	}
	cfg.ConnConfig.Tracer = counts
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatalf("opening pool: %v", err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// benchWireCounts counts what a pool's connections send: round trips (as
// benchCountingConn sees them) and statements, claims among them (as a
// pgx tracer sees them, single or pipelined).
type benchWireCounts struct {
	roundTrips, statements, claims atomic.Int64
}

type benchWireSnapshot struct{ roundTrips, statements, claims int64 }

func (c *benchWireCounts) snapshot() benchWireSnapshot {
	return benchWireSnapshot{c.roundTrips.Load(), c.statements.Load(), c.claims.Load()}
}

func (s benchWireSnapshot) minus(o benchWireSnapshot) benchWireSnapshot {
	return benchWireSnapshot{s.roundTrips - o.roundTrips, s.statements - o.statements, s.claims - o.claims}
}

func (c *benchWireCounts) statement(sql string) {
	c.statements.Add(1)
	if strings.Contains(sql, "FOR UPDATE OF o") {
		c.claims.Add(1)
	}
}

func (c *benchWireCounts) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.statement(data.SQL)
	return ctx
}

func (c *benchWireCounts) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *benchWireCounts) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *benchWireCounts) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.statement(data.SQL)
}

func (c *benchWireCounts) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// benchCountingConn counts a round trip whenever it writes after having read
// (or writes first): however many writes a client makes before it waits for
// the answer, the wait is one.
type benchCountingConn struct {
	net.Conn
	counts *benchWireCounts
	mu     sync.Mutex
	read   bool
	wrote  bool
}

func (c *benchCountingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.read || !c.wrote {
		c.counts.roundTrips.Add(1)
	}
	c.read, c.wrote = false, true
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *benchCountingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.read = true
		c.mu.Unlock()
	}
	return n, err
}
