package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// Fault follows one dependency of the consumer (Kafka or the database)
// through outages, per op (fetch, commit, dead_letter, begin, …): it counts
// every error (inbox_<part>_errors_total by op), shows the state
// (inbox_<part>_connected is 0 while any op is failing), and logs what each
// op's retry.Outage reports: an op's first failure, then at most one line
// per ErrorLogInterval with the count since the last line, and one line
// when it works again, with nothing for an op that flaps within the
// interval. Per op, so that a dead-letter topic that cannot be reached is
// not declared recovered by every successful fetch.
type Fault struct {
	part      string // "kafka" or "database"
	consumer  string
	logger    *slog.Logger
	interval  time.Duration
	errors    *prometheus.CounterVec
	connected prometheus.Gauge
	now       func() time.Time // the clock the log rate is kept by; tests move it

	mu  sync.Mutex
	ops map[string]*retry.Outage // every op that has failed; kept after recovery, for the flapping rule
}

func NewFault(part, consumer string, logger *slog.Logger, interval time.Duration, errs *prometheus.CounterVec, connected *prometheus.GaugeVec) *Fault {
	f := &Fault{part: part, consumer: consumer, logger: logger, interval: interval, errors: errs,
		connected: connected.WithLabelValues(consumer), ops: map[string]*retry.Outage{}, now: time.Now}
	f.connected.Set(1)
	return f
}

// Fail records a failed op.
func (f *Fault) Fail(ctx context.Context, op string, err error) {
	f.errors.WithLabelValues(f.consumer, op).Inc()
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.ops[op]
	if o == nil {
		o = retry.NewOutage(f.interval, func() time.Time { return f.now() })
		f.ops[op] = o
	}
	f.connected.Set(0)
	switch r := o.Fail(err); r.Event {
	case retry.Started:
		f.logger.WarnContext(ctx, "inbox cannot reach "+f.part+"; waiting it out",
			slog.String("consumer", f.consumer), slog.String("op", op), slog.Any("error", err))
	case retry.Continuing:
		f.logger.WarnContext(ctx, "inbox still cannot reach "+f.part,
			slog.String("consumer", f.consumer), slog.String("op", op), slog.Int("failures", r.Failures),
			slog.Duration("for", r.Down), slog.Any("error", err))
	}
}

// OK records that op worked; "" (any success of the database) ends every
// op's outage.
func (f *Fault) OK(ctx context.Context, op string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	down := false
	for name, o := range f.ops {
		if op != "" && name != op {
			down = down || o.Down()
			continue
		}
		if r := o.OK(); r.Event == retry.Recovered {
			f.logger.InfoContext(ctx, "inbox reaches "+f.part+" again", slog.String("consumer", f.consumer),
				slog.String("op", name), slog.Duration("after", r.Down))
		}
	}
	if !down {
		f.connected.Set(1)
	}
}

// Err describes the outages, nil when there is none.
func (f *Fault) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for _, op := range slices.Sorted(maps.Keys(f.ops)) {
		if down, since, lastErr := f.ops[op].State(); down {
			errs = append(errs, fmt.Errorf("%s unreachable (%s) for %s: %w", f.part, op, f.now().Sub(since).Round(time.Millisecond), lastErr))
		}
	}
	return errors.Join(errs...)
}
