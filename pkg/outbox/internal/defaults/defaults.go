// Package defaults holds the defaults both relays share: what a zero field
// of outbox.RelayConfig and of cdc.Config means. Each relay's own defaults
// are unexported beside its config. They are not exported to adopters, who
// read a default in the field's doc comment and get the values from the
// config's WithDefaults; here they are written once for both relays.
package defaults

import (
	"time"

	"github.com/onceflow/onceflow/pkg/outbox/internal/outage"
)

const (
	// BatchSize is the most events one relay publishes at once.
	BatchSize = 500
	// PublishTimeout bounds one batch's writes to Kafka.
	PublishTimeout = 30 * time.Second
	// BackoffMin is the first delay before an event whose publish failed
	// because of the message is tried again.
	BackoffMin = 100 * time.Millisecond
	// OutageBackoffMin is the first delay of a relay that waits out an
	// unreachable Kafka or Postgres.
	OutageBackoffMin = 100 * time.Millisecond
	// LogInterval is the most often a relay logs that a failure goes on;
	// Metrics.WatchBacklog uses it too.
	LogInterval = outage.DefaultLogInterval
)
