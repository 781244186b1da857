// Package metrics are the outbox relays' Prometheus metrics, one set per
// process that both relays (package outbox's polling relay, package
// outbox/cdc's log-based one) move; package outbox exports the set as
// outbox.Metrics.
package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
	"github.com/onceflow/onceflow/pkg/outbox/internal/outage"
)

// Metrics are the relays' Prometheus metrics (outbox.Metrics, a type of
// this one whose fields and methods the relays reach by conversion).
type Metrics struct {
	Pending, OldestAge, Dead, OwnedPartitions prometheus.Gauge
	KafkaConnected                            prometheus.Gauge
	SlotLag, SlotActive                       prometheus.Gauge
	ExternalStreaming                         prometheus.Gauge
	SlotLost                                  prometheus.Counter
	Published, Failures, Retries, DeadTotal   prometheus.Counter
	KafkaErrors                               prometheus.Counter
	DbErrors                                  *prometheus.CounterVec
	Claims, EmptyClaims                       prometheus.Counter
	RoundTrips                                *prometheus.CounterVec
	Refused                                   *prometheus.CounterVec
	PublishLag, BatchSize                     prometheus.Histogram
	CDC                                       *CDC
	Standby                                   *Standby
}

// New creates the relay metrics and registers them on reg (nil: not
// registered, for tests and tools).
func New(reg prometheus.Registerer) *Metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &Metrics{
		Pending:         gauge("outbox_pending_events", "Outbox rows waiting to be published (refreshed every rebalance interval)."),
		OldestAge:       gauge("outbox_oldest_pending_age_seconds", "Age of the oldest pending outbox row; 0 when none is pending."),
		Dead:            gauge("outbox_dead_events", "Outbox rows that exhausted their attempts and wait for a requeue."),
		OwnedPartitions: gauge("outbox_owned_partitions", "Logical partitions this relay owns."),
		Published:       counter("outbox_published_total", "Outbox events the broker acknowledged and the relay marked published."),
		Failures:        counter("outbox_publish_failures_total", "Publish attempts that failed because of the message (too large, refused by the topic's policy, …); each row counts, and MaxAttempts of them make it dead."),
		KafkaErrors: counter("outbox_kafka_errors_total",
			"Rows whose publish failed because of the broker (unreachable, not leader, timed out, …); each row counts. They stay pending and are not charged an attempt."),
		KafkaConnected: gauge("outbox_kafka_connected",
			"1 while the relay's last publish reached Kafka, 0 while Kafka is unreachable and the relay backs off (an idle relay keeps its last value)."),
		DbErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_db_errors_total",
			Help: "Failed Postgres operations of the relay, by op (polling relay: claim, heartbeat, gauges, listen; log-based relay: replication, retention, slot); each is retried with backoff.",
		}, []string{"op"}),
		Claims: counter("outbox_relay_claims_total",
			"Claims the polling relay ran (one claim statement each, with or without rows); claims per event is this over outbox_published_total."),
		EmptyClaims: counter("outbox_relay_empty_claims_total",
			"Claims of the polling relay that found no due row (polls, and wake-ups whose rows an earlier claim took)."),
		RoundTrips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_relay_db_roundtrips_total",
			Help: "Round trips from the polling relay to Postgres, by op: claim (begin, fences, claim, and arming when due: one pipeline), " +
				"commit (the marks and the commit: one pipeline), rollback (after a failure), heartbeat, gauges, listen. " +
				"Round trips per event is the sum over outbox_published_total. One-time statement preparation is not counted.",
		}, []string{"op"}),
		SlotLag: gauge("outbox_slot_lag_bytes",
			"WAL the log-based relay's replication slot retains: pg_current_wal_lsn() - confirmed_flush_lsn (0 without a CDC relay)."),
		SlotActive: gauge("outbox_slot_active",
			"1 while this process's log-based relay streams from its slot, 0 while it stands by (another relay holds the slot) or reconnects."),
		ExternalStreaming: gauge("outbox_external_publisher_streaming",
			"RELAY_MODE=debezium: 1 while a connection streams from the external publisher's replication slot (Debezium's task runs), "+
				"0 while the slot is missing or nobody reads it (nothing is published). Always 1 in the other modes, which have no external publisher."),
		SlotLost: counter("outbox_slot_lost_total",
			"Replication slots the log-based relay found dropped or invalidated and replaced; each leaves a window of events that may need a replay (see the runbook)."),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_transitions_refused_total",
			Help: "Writes of an outbox lifecycle (lifecycle.go) that found the row in another state than they expected and changed nothing, by transition: a late or stale writer, seen.",
		}, []string{"transition"}),
		Retries:   counter("outbox_publish_retries_total", "Events published on a retry, after at least one failed attempt."),
		DeadTotal: counter("outbox_dead_total", "Outbox rows that went dead."),
		PublishLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_publish_lag_seconds",
			Help:    "From the outbox insert (the business commit) to the broker's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_batch_size",
			Help:    "Rows claimed and published per batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Pending, m.OldestAge, m.Dead, m.OwnedPartitions, m.Published, m.Failures,
			m.Retries, m.DeadTotal, m.PublishLag, m.BatchSize, m.KafkaErrors, m.KafkaConnected, m.DbErrors,
			m.SlotLag, m.SlotActive, m.ExternalStreaming, m.SlotLost, m.Claims, m.EmptyClaims, m.RoundTrips, m.Refused)
	}
	m.CDC = newCDC(reg)
	m.Standby = newStandby(reg)
	// Connected until a publish says otherwise: a relay that has not published
	// yet has no evidence of an outage, and the alert on 0 must not fire for it.
	m.KafkaConnected.Set(1)
	// Likewise for the external publisher, which only WatchSlot reads: a
	// service with a relay of its own must not page for Debezium.
	m.ExternalStreaming.Set(1)
	for _, op := range []string{"claim", "heartbeat", "gauges", "listen", "replication", "retention", "slot"} {
		m.DbErrors.WithLabelValues(op) // export zeros, so rate() works from the start
	}
	for _, tr := range []string{lifecycle.TransitionMarkPublished, lifecycle.TransitionMarkFailed, lifecycle.TransitionMarkDead, lifecycle.TransitionRecordPosition, lifecycle.TransitionGapReplayed} {
		m.Refused.WithLabelValues(tr)
	}
	for _, op := range []string{"claim", "commit", "rollback", "heartbeat", "gauges", "listen"} {
		m.RoundTrips.WithLabelValues(op)
	}
	return m
}

// sqlBacklogGauges reads the backlog gauges; each subquery reads one partial index,
// so the cost does not grow with the published rows. Pending is outboxadmin.Backlog's:
// not yet published, whatever the relay mode (lifecycle.BacklogPending).
var sqlBacklogGauges = `
SELECT (SELECT count(*) FROM outbox_events WHERE ` + lifecycle.BacklogPending + `),
       (SELECT created_at FROM outbox_events WHERE ` + lifecycle.BacklogPending + ` ORDER BY id LIMIT 1),
       (SELECT count(*) FROM outbox_events WHERE state = 'dead')`

// Refresh reads the backlog gauges from the table.
func (m *Metrics) Refresh(ctx context.Context, pool *pgxpool.Pool) error {
	var (
		pending, dead int64
		oldest        *time.Time
	)
	err := pool.QueryRow(ctx, sqlBacklogGauges).Scan(&pending, &oldest, &dead)
	if err != nil {
		return fmt.Errorf("reading the backlog: %w", err)
	}
	m.Pending.Set(float64(pending))
	m.Dead.Set(float64(dead))
	m.OldestAge.Set(0)
	if oldest != nil {
		m.OldestAge.Set(time.Since(*oldest).Seconds())
	}
	return nil
}

// WatchBacklog is outbox.Metrics.WatchBacklog.
func (m *Metrics) WatchBacklog(ctx context.Context, pool *pgxpool.Pool, interval time.Duration, logger *slog.Logger) error {
	m.WatchBacklogOf(ctx, pool, interval, outage.New("refreshing the backlog gauges", logger, outage.DefaultLogInterval), nil)
	return nil
}

// WatchBacklogOf is WatchBacklog's loop; a relay passes roundTrips (nil:
// not counted) to count its refreshes among its round trips.
func (m *Metrics) WatchBacklogOf(ctx context.Context, pool *pgxpool.Pool, interval time.Duration, health *outage.Outage, roundTrips prometheus.Counter) {
	m.Every(ctx, interval, health, roundTrips, func(ctx context.Context) error { return m.Refresh(ctx, pool) })
}

// WatchSlot is outbox.Metrics.WatchSlot.
func (m *Metrics) WatchSlot(ctx context.Context, pool *pgxpool.Pool, slot string, interval time.Duration, logger *slog.Logger) error {
	health := outage.New("refreshing the replication slot's gauges", logger, outage.DefaultLogInterval)
	m.Every(ctx, interval, health, nil, func(ctx context.Context) error {
		s, err := ReadSlot(ctx, pool, slot)
		if err != nil {
			return err
		}
		m.SetSlot(s)
		streaming := 0.0
		if s.active {
			streaming = 1
		}
		m.ExternalStreaming.Set(streaming)
		return nil
	})
	return nil
}

// Every runs refresh now and then every interval until ctx ends, counting
// each run in roundTrips (nil: not counted) and each failure in
// outbox_db_errors_total{op="gauges"}.
func (m *Metrics) Every(ctx context.Context, interval time.Duration, health *outage.Outage, roundTrips prometheus.Counter, refresh func(context.Context) error) {
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
			health.OK(ctx)
		case ctx.Err() == nil:
			m.DbErrors.WithLabelValues("gauges").Inc()
			health.Fail(ctx, err)
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

// SlotGauges is what slotGauges read.
type SlotGauges struct {
	lag, retained, keepMB, dead int64
	active                      bool
}

// ReadSlot reads slot's gauges; the log-based relay reads its own slot so,
// and WatchSlot an external publisher's.
func ReadSlot(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, slot string) (SlotGauges, error) {
	var s SlotGauges
	if err := q.QueryRow(ctx, slotGauges, slot).Scan(&s.lag, &s.retained, &s.keepMB, &s.dead, &s.active); err != nil {
		return s, fmt.Errorf("reading the slot's gauges: %w", err)
	}
	return s, nil
}

// SetSlot sets the slot's gauges and the dead rows from s.
func (m *Metrics) SetSlot(s SlotGauges) {
	// Unlimited is +Inf, so retained / keep size, what the alert
	// OutboxSlotNearInvalidation divides, is 0 and not +Inf.
	keep := math.Inf(1)
	if s.keepMB >= 0 {
		keep = float64(s.keepMB << 20)
	}
	m.SlotLag.Set(float64(s.lag))
	m.CDC.RetainedWAL.Set(float64(s.retained))
	m.CDC.WalKeepSize.Set(keep)
	m.Dead.Set(float64(s.dead))
}

// Refuse counts and logs a writer whose transition found the row in
// another state than it expected: it changed nothing, which is what a late
// writer must do, and is seen.
func (m *Metrics) Refuse(ctx context.Context, logger *slog.Logger, transition, why string, attrs ...any) {
	m.Refused.WithLabelValues(transition).Inc()
	logger.WarnContext(ctx, "outbox transition refused: the row is not in the state this writer expected; nothing changed",
		append([]any{slog.String("transition", transition), slog.String("why", why)}, attrs...)...)
}
