package inbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// Metrics are the consumers' Prometheus metrics, labelled by consumer name.
// Create them once per process and share them between its consumers.
type Metrics = engine.Metrics

// The reason label of inbox_dead_lettered_total: why a message went to the
// dead-letter topic, in classes few enough to alert on (the full error is in
// the message's dlt-reason header and the inbox row's last_error).
const (
	// ReasonUndecodable: the message is not an event envelope.
	ReasonUndecodable = engine.ReasonUndecodable

	// ReasonInvalid: the envelope or payload broke the contract (event.ErrInvalid).
	ReasonInvalid = engine.ReasonInvalid

	// ReasonPermanent: the handler said retrying cannot help (Permanent).
	ReasonPermanent = engine.ReasonPermanent

	// ReasonExhausted: a transient failure outlasted MaxAttempts (a version
	// gap that was never filled among them, under GapWait).
	ReasonExhausted = engine.ReasonExhausted

	// ReasonStale: an older event arrived after a newer one of its
	// aggregate was applied (StaleDeadLetter).
	ReasonStale = engine.ReasonStale
)

// NewMetrics creates the consumer metrics and registers them on reg (nil:
// not registered, for tests and tools).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	return engine.NewMetrics(reg)
}
