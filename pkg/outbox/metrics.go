package outbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox/internal/metrics"
)

// Metrics are the relays' Prometheus metrics, of both the polling Relay and
// the log-based one (package outbox/cdc). Create them once per process and
// share them between the relays of that process. WatchBacklog and
// WatchSlot refresh the backlog's gauges where no relay of this process
// does.
type Metrics = metrics.Metrics

// NewMetrics creates the relay metrics and registers them on reg (nil: not
// registered, for tests and tools).
func NewMetrics(reg prometheus.Registerer) *Metrics { return metrics.New(reg) }
