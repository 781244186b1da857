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
// through outages, per op (fetch, commit, dead_letter, begin, …): it counts
// every error (inbox_<part>_errors_total by op), shows the state
// (inbox_<part>_connected is 0 while any op is failing), and logs at a
// bounded rate: an op's first failure, then at most one line per
// ErrorLogInterval with the count since the last line, and one line when
// it works again. Per op, so that a dead-letter topic that cannot be reached
// is not declared recovered by every successful fetch.
type fault struct {
	part      string // "kafka" or "database"
	consumer  string
	logger    *slog.Logger
	interval  time.Duration
	errors    *prometheus.CounterVec
	connected prometheus.Gauge
	now       func() time.Time // the clock the log rate is kept by; tests move it

	mu      sync.Mutex
	failing map[string]*outage // by op
}

type outage struct {
	since, logged time.Time
	unseen        int // failures since the last line
	lastErr       error
}

func newFault(part, consumer string, logger *slog.Logger, interval time.Duration, errs *prometheus.CounterVec, connected *prometheus.GaugeVec) *fault {
	f := &fault{part: part, consumer: consumer, logger: logger, interval: interval, errors: errs,
		connected: connected.WithLabelValues(consumer), failing: map[string]*outage{}, now: time.Now}
	f.connected.Set(1)
	return f
}

// fail records a failed op.
func (f *fault) fail(ctx context.Context, op string, err error) {
	f.errors.WithLabelValues(f.consumer, op).Inc()
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	o := f.failing[op]
	if o == nil {
		f.failing[op] = &outage{since: now, logged: now, lastErr: err}
		f.connected.Set(0)
		f.logger.WarnContext(ctx, "inbox cannot reach "+f.part+"; waiting it out",
			slog.String("consumer", f.consumer), slog.String("op", op), slog.Any("error", err))
		return
	}
	o.lastErr = err
	o.unseen++
	if now.Sub(o.logged) >= f.interval {
		f.logger.WarnContext(ctx, "inbox still cannot reach "+f.part,
			slog.String("consumer", f.consumer), slog.String("op", op), slog.Int("failures", o.unseen),
			slog.Duration("for", now.Sub(o.since)), slog.Any("error", err))
		o.logged, o.unseen = now, 0
	}
}

// ok records that op worked; "" (any success of the database) ends every
// op's outage.
func (f *fault) ok(ctx context.Context, op string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.failing) == 0 {
		return
	}
	for name, o := range f.failing {
		if op != "" && name != op {
			continue
		}
		delete(f.failing, name)
		f.logger.InfoContext(ctx, "inbox reaches "+f.part+" again", slog.String("consumer", f.consumer),
			slog.String("op", name), slog.Duration("after", f.now().Sub(o.since)))
	}
	if len(f.failing) == 0 {
		f.connected.Set(1)
	}
}

// err describes the outages, nil when there is none.
func (f *fault) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for op, o := range f.failing {
		errs = append(errs, fmt.Errorf("%s unreachable (%s) for %s: %w", f.part, op, f.now().Sub(o.since).Round(time.Millisecond), o.lastErr))
	}
	return errors.Join(errs...)
}

// Healthy reports what keeps the consumer from working right now: Kafka or
// the database unreachable (the last error says why), or nil. The consumer
// waits outages out by itself; a service's /readyz reports this so the
// broken part is visible, and its metrics (inbox_kafka_connected,
// inbox_database_connected) show it over time.
func (c *Consumer) Healthy() error {
	return errors.Join(c.kafka.err(), c.db.err())
}
