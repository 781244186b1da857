// Package outage logs, in the relays' words, an outage of one thing a relay
// does against a dependency. Both relays (the polling one in package outbox,
// the log-based one in outbox/cdc) and the metrics' refresh loops use it.
package outage

import (
	"context"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// DefaultLogInterval is the most often an outage is logged while it goes on
// (the relays' LogInterval default, internal/defaults.LogInterval).
const DefaultLogInterval = 30 * time.Second

// Outage logs, in the relay's words, what retry.Outage reports about one
// thing the relay does against a dependency (publishing to Kafka, claiming
// in Postgres, heartbeating, …): the first failure, at most one line per
// interval while it lasts, one on recovery, and nothing for flapping.
type Outage struct {
	what   string // "publishing to Kafka", "claiming rows", …
	logger *slog.Logger
	t      *retry.Outage
}

// New tracks what ("publishing to Kafka"), logging to logger at most once
// per interval while it fails.
func New(what string, logger *slog.Logger, interval time.Duration) *Outage {
	return &Outage{what: what, logger: logger, t: retry.NewOutage(interval, nil)}
}

// Fail records a failure and logs it if the tracker says so.
func (o *Outage) Fail(ctx context.Context, err error) {
	switch r := o.t.Fail(err); r.Event {
	case retry.Started:
		o.logger.WarnContext(ctx, "outbox relay: "+o.what+" failed; retrying with backoff",
			slog.Any("error", err))
	case retry.Continuing:
		o.logger.WarnContext(ctx, "outbox relay: "+o.what+" still failing; retrying with backoff",
			slog.Any("error", err), slog.Int("failures", r.Failures),
			slog.Duration("down_for", r.Down.Round(time.Millisecond)))
	}
}

// OK records a success, logging the recovery if the outage was logged.
func (o *Outage) OK(ctx context.Context) {
	if r := o.t.OK(); r.Event == retry.Recovered {
		o.logger.InfoContext(ctx, "outbox relay: "+o.what+" works again",
			slog.Int("failures", r.Failures), slog.Duration("down_for", r.Down.Round(time.Millisecond)))
	}
}

// State reports whether an outage is under way, since when and its last error.
func (o *Outage) State() (down bool, since time.Time, lastErr error) {
	return o.t.State()
}
