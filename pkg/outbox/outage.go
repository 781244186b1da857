package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// outage logs, in the relay's words, what retry.Outage reports about one
// thing the relay does against a dependency (publishing to Kafka, claiming
// in Postgres, heartbeating, …): the first failure, at most one line per
// interval while it lasts, one on recovery, and nothing for flapping.
type outage struct {
	what   string // "publishing to Kafka", "claiming rows", …
	logger *slog.Logger
	t      *retry.Outage
}

func newOutage(what string, logger *slog.Logger, interval time.Duration) *outage {
	return &outage{what: what, logger: logger, t: retry.NewOutage(interval, nil)}
}

// fail records a failure and logs it if the tracker says so.
func (o *outage) fail(ctx context.Context, err error) {
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

// ok records a success, logging the recovery if the outage was logged.
func (o *outage) ok(ctx context.Context) {
	if r := o.t.OK(); r.Event == retry.Recovered {
		o.logger.InfoContext(ctx, "outbox relay: "+o.what+" works again",
			slog.Int("failures", r.Failures), slog.Duration("down_for", r.Down.Round(time.Millisecond)))
	}
}

// state reports whether an outage is under way, since when and its last error.
func (o *outage) state() (down bool, since time.Time, lastErr error) {
	return o.t.State()
}
