package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the relay's Prometheus metrics. Create them once per process
// and share them between the relays of that process.
type Metrics struct {
	pending, oldestAge, dead, ownedPartitions prometheus.Gauge
	kafkaConnected                            prometheus.Gauge
	slotLag, slotActive                       prometheus.Gauge
	externalStreaming                         prometheus.Gauge
	slotLost                                  prometheus.Counter
	published, failures, retries, deadTotal   prometheus.Counter
	kafkaErrors                               prometheus.Counter
	dbErrors                                  *prometheus.CounterVec
	claims, emptyClaims                       prometheus.Counter
	roundTrips                                *prometheus.CounterVec
	refused                                   *prometheus.CounterVec
	publishLag, batchSize                     prometheus.Histogram
	cdc                                       *cdcMetrics
	standby                                   *standbyMetrics
}

// NewMetrics creates the relay metrics and registers them on reg (nil: not
// registered, for tests and tools).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &Metrics{
		pending:         gauge("outbox_pending_events", "Outbox rows waiting to be published (refreshed every rebalance interval)."),
		oldestAge:       gauge("outbox_oldest_pending_age_seconds", "Age of the oldest pending outbox row; 0 when none is pending."),
		dead:            gauge("outbox_dead_events", "Outbox rows that exhausted their attempts and wait for a requeue."),
		ownedPartitions: gauge("outbox_owned_partitions", "Logical partitions this relay owns."),
		published:       counter("outbox_published_total", "Outbox events the broker acknowledged and the relay marked published."),
		failures:        counter("outbox_publish_failures_total", "Publish attempts that failed because of the message (too large, refused by the topic's policy, …); each row counts, and MaxAttempts of them make it dead."),
		kafkaErrors: counter("outbox_kafka_errors_total",
			"Rows whose publish failed because of the broker (unreachable, not leader, timed out, …); each row counts. They stay pending and are not charged an attempt."),
		kafkaConnected: gauge("outbox_kafka_connected",
			"1 while the relay's last publish reached Kafka, 0 while Kafka is unreachable and the relay backs off (an idle relay keeps its last value)."),
		dbErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_db_errors_total",
			Help: "Failed Postgres operations of the relay, by op (polling relay: claim, heartbeat, gauges, listen; log-based relay: replication, retention, slot); each is retried with backoff.",
		}, []string{"op"}),
		claims: counter("outbox_relay_claims_total",
			"Claims the polling relay ran (one claim statement each, with or without rows); claims per event is this over outbox_published_total."),
		emptyClaims: counter("outbox_relay_empty_claims_total",
			"Claims of the polling relay that found no due row (polls, and wake-ups whose rows an earlier claim took)."),
		roundTrips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_relay_db_roundtrips_total",
			Help: "Round trips from the polling relay to Postgres, by op: claim (begin, fences, claim, and arming when due: one pipeline), " +
				"commit (the marks and the commit: one pipeline), rollback (after a failure), heartbeat, gauges, listen. " +
				"Round trips per event is the sum over outbox_published_total. One-time statement preparation is not counted.",
		}, []string{"op"}),
		slotLag: gauge("outbox_slot_lag_bytes",
			"WAL the log-based relay's replication slot retains: pg_current_wal_lsn() - confirmed_flush_lsn (0 without a CDC relay)."),
		slotActive: gauge("outbox_slot_active",
			"1 while this process's log-based relay streams from its slot, 0 while it stands by (another relay holds the slot) or reconnects."),
		externalStreaming: gauge("outbox_external_publisher_streaming",
			"RELAY_MODE=debezium: 1 while a connection streams from the external publisher's replication slot (Debezium's task runs), "+
				"0 while the slot is missing or nobody reads it (nothing is published). Always 1 in the other modes, which have no external publisher."),
		slotLost: counter("outbox_slot_lost_total",
			"Replication slots the log-based relay found dropped or invalidated and replaced; each leaves a window of events that may need a replay (see the runbook)."),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_transitions_refused_total",
			Help: "Writes of an outbox lifecycle (lifecycle.go) that found the row in another state than they expected and changed nothing, by transition: a late or stale writer, seen.",
		}, []string{"transition"}),
		retries:   counter("outbox_publish_retries_total", "Events published on a retry, after at least one failed attempt."),
		deadTotal: counter("outbox_dead_total", "Outbox rows that went dead."),
		publishLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_publish_lag_seconds",
			Help:    "From the outbox insert (the business commit) to the broker's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_batch_size",
			Help:    "Rows claimed and published per batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.pending, m.oldestAge, m.dead, m.ownedPartitions, m.published, m.failures,
			m.retries, m.deadTotal, m.publishLag, m.batchSize, m.kafkaErrors, m.kafkaConnected, m.dbErrors,
			m.slotLag, m.slotActive, m.externalStreaming, m.slotLost, m.claims, m.emptyClaims, m.roundTrips, m.refused)
	}
	m.cdc = newCDCMetrics(reg)
	m.standby = newStandbyMetrics(reg)
	// Connected until a publish says otherwise: a relay that has not published
	// yet has no evidence of an outage, and the alert on 0 must not fire for it.
	m.kafkaConnected.Set(1)
	// Likewise for the external publisher, which only WatchSlot reads: a
	// service with a relay of its own must not page for Debezium.
	m.externalStreaming.Set(1)
	for _, op := range []string{"claim", "heartbeat", "gauges", "listen", "replication", "retention", "slot"} {
		m.dbErrors.WithLabelValues(op) // export zeros, so rate() works from the start
	}
	for _, tr := range []string{transitionMarkPublished, transitionMarkFailed, transitionMarkDead, transitionRecordPosition, transitionGapReplayed} {
		m.refused.WithLabelValues(tr)
	}
	for _, op := range []string{"claim", "commit", "rollback", "heartbeat", "gauges", "listen"} {
		m.roundTrips.WithLabelValues(op)
	}
	return m
}

// sqlBacklogGauges reads the backlog gauges; each subquery reads one partial index,
// so the cost does not grow with the published rows. Pending is Backlog's:
// not yet published, whatever the relay mode (backlogPending).
var sqlBacklogGauges = `
SELECT (SELECT count(*) FROM outbox_events WHERE ` + backlogPending + `),
       (SELECT created_at FROM outbox_events WHERE ` + backlogPending + ` ORDER BY id LIMIT 1),
       (SELECT count(*) FROM outbox_events WHERE state = 'dead')`

// refresh reads the backlog gauges from the table.
func (m *Metrics) refresh(ctx context.Context, pool *pgxpool.Pool) error {
	var (
		pending, dead int64
		oldest        *time.Time
	)
	err := pool.QueryRow(ctx, sqlBacklogGauges).Scan(&pending, &oldest, &dead)
	if err != nil {
		return fmt.Errorf("reading the backlog: %w", err)
	}
	m.pending.Set(float64(pending))
	m.dead.Set(float64(dead))
	m.oldestAge.Set(0)
	if oldest != nil {
		m.oldestAge.Set(time.Since(*oldest).Seconds())
	}
	return nil
}

// WatchBacklog refreshes the backlog gauges (outbox_pending_events,
// outbox_oldest_pending_age_seconds, outbox_dead_events) from pool every
// interval until ctx ends, and then returns nil; while Postgres is away it
// keeps trying every interval and logs at a bounded rate. A Relay runs the
// same loop on a goroutine of its own, beside its claim loop, so the gauges
// keep moving while it is busy; run WatchBacklog in a process that writes to
// the outbox while no relay of its own runs (relaying paused, or done by
// another deployment), so that a backlog nobody drains still shows, and
// still alerts.
func (m *Metrics) WatchBacklog(ctx context.Context, pool *pgxpool.Pool, interval time.Duration, logger *slog.Logger) error {
	m.watchBacklog(ctx, pool, interval, newOutage("refreshing the backlog gauges", logger, DefaultLogInterval), nil)
	return nil
}

// watchBacklog is WatchBacklog's loop; a relay passes roundTrips (nil:
// not counted) to count its refreshes among its round trips.
func (m *Metrics) watchBacklog(ctx context.Context, pool *pgxpool.Pool, interval time.Duration, health *outage, roundTrips prometheus.Counter) {
	m.every(ctx, interval, health, roundTrips, func(ctx context.Context) error { return m.refresh(ctx, pool) })
}

// WatchSlot refreshes, from pool every interval until ctx ends (then it
// returns nil), the gauges of a replication slot that a publisher outside
// this process streams the outbox from (ModeDebezium: Debezium's slot,
// its slot.name): outbox_slot_lag_bytes (the WAL written since the
// position the publisher confirmed: how far behind it is),
// outbox_slot_retained_wal_bytes and outbox_slot_wal_keep_size_bytes (how
// close the slot is to being invalidated), outbox_external_publisher_streaming
// (whether anyone streams from the slot at all) and outbox_dead_events.
// These are the backlog signals of that mode: the table's pending rows say
// nothing there, since nobody marks them published, so run WatchSlot
// instead of WatchBacklog. The slot is only read: it is the publisher's,
// created and dropped by it.
//
// While Postgres is away it keeps trying every interval, logs at a bounded
// rate and leaves the gauges at their last values.
func (m *Metrics) WatchSlot(ctx context.Context, pool *pgxpool.Pool, slot string, interval time.Duration, logger *slog.Logger) error {
	health := newOutage("refreshing the replication slot's gauges", logger, DefaultLogInterval)
	m.every(ctx, interval, health, nil, func(ctx context.Context) error {
		s, err := readSlot(ctx, pool, slot)
		if err != nil {
			return err
		}
		m.setSlot(s)
		streaming := 0.0
		if s.active {
			streaming = 1
		}
		m.externalStreaming.Set(streaming)
		return nil
	})
	return nil
}

// every runs refresh now and then every interval until ctx ends, counting
// each run in roundTrips (nil: not counted) and each failure in
// outbox_db_errors_total{op="gauges"}.
func (m *Metrics) every(ctx context.Context, interval time.Duration, health *outage, roundTrips prometheus.Counter, refresh func(context.Context) error) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if roundTrips != nil {
			roundTrips.Inc()
		}
		// Bounded, so a hung connection cannot freeze the gauges for longer.
		refreshCtx, cancel := context.WithTimeout(ctx, max(interval, time.Second))
		err := refresh(refreshCtx)
		cancel()
		switch {
		case err == nil:
			health.ok(ctx)
		case ctx.Err() == nil:
			m.dbErrors.WithLabelValues("gauges").Inc()
			health.fail(ctx, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// slotGauges reads a slot's position against the server's (0 while there is
// no slot yet), the WAL the slot keeps from being recycled (from its
// restart_lsn, which may be older than its confirmed position), the
// server's max_slot_wal_keep_size (in MB, -1: unlimited), the dead rows
// (which the polling relay's backlog gauges count in poll mode and nothing
// else counts in the other modes), and whether a walsender streams from
// the slot.
const slotGauges = `
SELECT coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)
                 FROM pg_replication_slots WHERE slot_name = $1), 0)::bigint,
       coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)
                 FROM pg_replication_slots WHERE slot_name = $1), 0)::bigint,
       (SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'),
       (SELECT count(*) FROM outbox_events WHERE state = 'dead'),
       coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)`

// slotGaugeValues is what slotGauges read.
type slotGaugeValues struct {
	lag, retained, keepMB, dead int64
	active                      bool
}

// readSlot reads slot's gauges; the log-based relay reads its own slot so,
// and WatchSlot an external publisher's.
func readSlot(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, slot string) (slotGaugeValues, error) {
	var s slotGaugeValues
	if err := q.QueryRow(ctx, slotGauges, slot).Scan(&s.lag, &s.retained, &s.keepMB, &s.dead, &s.active); err != nil {
		return s, fmt.Errorf("reading the slot's gauges: %w", err)
	}
	return s, nil
}

// setSlot sets the slot's gauges and the dead rows from s.
func (m *Metrics) setSlot(s slotGaugeValues) {
	// Unlimited is +Inf, so retained / keep size, what the alert
	// OutboxSlotNearInvalidation divides, is 0 and not +Inf.
	keep := math.Inf(1)
	if s.keepMB >= 0 {
		keep = float64(s.keepMB << 20)
	}
	m.slotLag.Set(float64(s.lag))
	m.cdc.retainedWAL.Set(float64(s.retained))
	m.cdc.walKeepSize.Set(keep)
	m.dead.Set(float64(s.dead))
}
