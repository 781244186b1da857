package inbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// Metrics are the consumers' Prometheus metrics, labelled by consumer name.
// Create them once per process and share them between its consumers.
//
// The reason label of inbox_dead_lettered_total says why a message went to
// the dead-letter topic, in classes few enough to alert on (the full error
// is in the letter's dlt-reason header and the inbox row's last_error):
//   - undecodable: the message is not an event envelope;
//   - invalid: the envelope or payload broke the contract (event.ErrInvalid);
//   - permanent: the handler said retrying cannot help (Permanent);
//   - exhausted: a transient failure outlasted Config.MaxAttempts (among
//     them a version gap that was never filled, Config.AcceptGaps false);
//   - stale: an older event arrived after a newer one of its aggregate was
//     applied (Config.SkipStale false).
type Metrics = engine.Metrics

// NewMetrics creates the consumer metrics and registers them on reg (nil:
// not registered, for tests and tools).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	return engine.NewMetrics(reg)
}
