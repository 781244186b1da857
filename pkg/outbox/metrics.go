package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox/internal/metrics"
)

// Metrics are the relays' Prometheus metrics, of both the polling Relay and
// the log-based one (package outbox/cdc). Create them once per process and
// share them between the relays of that process. The relays reach the
// metrics through the internal set this type is made of; an adopter only
// creates, shares and watches them.
type Metrics metrics.Metrics

// NewMetrics creates the relay metrics and registers them on reg (nil: not
// registered, for tests and tools).
func NewMetrics(reg prometheus.Registerer) *Metrics { return (*Metrics)(metrics.New(reg)) }

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
	return m.set().WatchBacklog(ctx, pool, interval, logger)
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
	return m.set().WatchSlot(ctx, pool, slot, interval, logger)
}

// set is m as the internal set the relays move.
func (m *Metrics) set() *metrics.Metrics { return (*metrics.Metrics)(m) }
