package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the relay's Prometheus metrics. Create them once per process
// and share them between the relays of that process.
type Metrics struct {
	pending, oldestAge, dead, ownedPartitions prometheus.Gauge
	published, failures, retries, deadTotal   prometheus.Counter
	publishLag, batchSize                     prometheus.Histogram
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
		failures:        counter("outbox_publish_failures_total", "Publish attempts that failed (each row counts)."),
		retries:         counter("outbox_publish_retries_total", "Events published on a retry, after at least one failed attempt."),
		deadTotal:       counter("outbox_dead_total", "Outbox rows that went dead."),
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
			m.retries, m.deadTotal, m.publishLag, m.batchSize)
	}
	return m
}

// refresh reads the backlog gauges from the table; each query reads one
// partial index, so the cost does not grow with the published rows.
func (m *Metrics) refresh(ctx context.Context, pool *pgxpool.Pool) error {
	var (
		pending, dead int64
		oldest        *time.Time
	)
	err := pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM outbox_events WHERE state = 'pending'),
		       (SELECT created_at FROM outbox_events WHERE state = 'pending' ORDER BY id LIMIT 1),
		       (SELECT count(*) FROM outbox_events WHERE state = 'dead')`).Scan(&pending, &oldest, &dead)
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

// ReportBacklog refreshes m's backlog gauges (pending, oldest age, dead)
// every interval until ctx ends. A relay refreshes them itself; a process
// that writes the outbox but runs no relay (the relay deployed apart) runs
// this, so that the backlog stays visible, and alertable, while every relay
// is down.
func ReportBacklog(ctx context.Context, pool *pgxpool.Pool, m *Metrics, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := m.refresh(ctx, pool); err != nil && ctx.Err() == nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
