package outbox

import (
	"time"

	"github.com/onceflow/onceflow/pkg/outbox/internal/outage"
)

// Both relays' configs (RelayConfig, cdc.Config) follow one convention, as
// PruneConfig and the inbox's configs do: a zero field means its documented
// default, a Default… constant; a negative size or duration is an error
// from Validate, because a typo'd sign must not quietly become the default.
// WithDefaults fills the zero fields and keeps the negative ones for
// Validate to see; the constructors call both (pkg/internal/knob).

// The defaults both relays share. Each relay's own are beside its config
// (relay_config.go, package outbox/cdc's config.go).
const (
	// DefaultBatchSize is the most events one relay publishes at once.
	DefaultBatchSize = 500
	// DefaultPublishTimeout bounds one batch's writes to Kafka.
	DefaultPublishTimeout = 30 * time.Second
	// DefaultBackoffMin is the first delay before an event whose publish
	// failed because of the message is tried again.
	DefaultBackoffMin = 100 * time.Millisecond
	// DefaultOutageBackoffMin is the first delay of a relay that waits out
	// an unreachable Kafka or Postgres.
	DefaultOutageBackoffMin = 100 * time.Millisecond
	// DefaultLogInterval is the most often a relay logs that a failure goes
	// on; WatchBacklog uses it too.
	DefaultLogInterval = outage.DefaultLogInterval
)
