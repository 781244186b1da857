package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fault follows one dependency of the consumer (Kafka or the database)
// through an outage: it counts every error (inbox_<part>_errors_total by
// op), shows the state (inbox_<part>_connected), and logs at a bounded
// rate: the first failure, then at most one line per ErrorLogInterval with
// the count since the last line, and one line on recovery.
type fault struct {
	part      string // "kafka" or "database"
	consumer  string
	logger    *slog.Logger
	interval  time.Duration
	errors    *prometheus.CounterVec
	connected prometheus.Gauge

	mu      sync.Mutex
	failing bool
	since   time.Time
	logged  time.Time
	unseen  int // failures since the last line
	lastErr error
}

func newFault(part, consumer string, logger *slog.Logger, interval time.Duration, errs *prometheus.CounterVec, connected *prometheus.GaugeVec) *fault {
	f := &fault{part: part, consumer: consumer, logger: logger, interval: interval, errors: errs,
		connected: connected.WithLabelValues(consumer)}
	f.connected.Set(1)
	return f
}

// fail records a failed op (fetch, commit, begin, …).
func (f *fault) fail(ctx context.Context, op string, err error) {
	f.errors.WithLabelValues(f.consumer, op).Inc()
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	f.lastErr = err
	if !f.failing {
		f.failing, f.since, f.logged, f.unseen = true, now, now, 0
		f.connected.Set(0)
		f.logger.WarnContext(ctx, "inbox cannot reach "+f.part+"; waiting it out",
			slog.String("consumer", f.consumer), slog.String("op", op), slog.Any("error", err))
		return
	}
	f.unseen++
	if now.Sub(f.logged) >= f.interval {
		f.logger.WarnContext(ctx, "inbox still cannot reach "+f.part,
			slog.String("consumer", f.consumer), slog.String("op", op), slog.Int("failures", f.unseen),
			slog.Duration("for", now.Sub(f.since)), slog.Any("error", err))
		f.logged, f.unseen = now, 0
	}
}

// ok records a successful op; it ends an outage.
func (f *fault) ok(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.failing {
		return
	}
	f.failing = false
	f.connected.Set(1)
	f.logger.InfoContext(ctx, "inbox reaches "+f.part+" again", slog.String("consumer", f.consumer),
		slog.Duration("after", time.Since(f.since)))
}

// err describes the outage, nil when there is none.
func (f *fault) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.failing {
		return nil
	}
	return fmt.Errorf("%s unreachable for %s: %w", f.part, time.Since(f.since).Round(time.Millisecond), f.lastErr)
}

// Healthy reports what keeps the consumer from working right now: Kafka or
// the database unreachable (the last error says why), or nil. The consumer
// waits outages out by itself; a service's /readyz reports this so the
// broken part is visible, and its metrics (inbox_kafka_connected,
// inbox_database_connected) show it over time.
func (c *Consumer) Healthy() error {
	return errors.Join(c.kafka.err(), c.db.err())
}
