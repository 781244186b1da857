package outbox

import (
	"fmt"
	"time"
)

// Both relays' configs (RelayConfig, CDCConfig) follow one convention, as
// PruneConfig does: a zero field means its documented default, a Default…
// constant; a negative size or duration is an error from Validate, because
// a typo'd sign must not quietly become the default. WithDefaults fills
// the zero fields and keeps the negative ones for Validate to see; the
// constructors call both.

// The defaults both relays share. Each relay's own are beside its config
// (relay_config.go, cdc_config.go).
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
	DefaultLogInterval = 30 * time.Second
)

// defaultTopic is both relays' default Topic: aggregateType + ".events".
func defaultTopic(aggregateType string) string { return aggregateType + ".events" }

// orDefault sets *v to def if it is zero.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// knob is one size or duration of a config, for refuseNegative.
type knob struct {
	name string
	v    any // as the error shows it
	neg  bool
}

// signed is the knob of a config field named name whose value is v.
func signed[T int | time.Duration](name string, v T) knob { return knob{name, v, v < 0} }

// refuseNegative reports the first of knobs that is negative, naming the
// field as config.name.
func refuseNegative(config string, knobs ...knob) error {
	for _, k := range knobs {
		if k.neg {
			return fmt.Errorf("outbox: %s.%s is negative (%v); leave it zero for the default", config, k.name, k.v)
		}
	}
	return nil
}

// refuseCrossed reports a lower bound above its upper one.
func refuseCrossed(config, loName string, lo time.Duration, hiName string, hi time.Duration) error {
	if lo > hi {
		return fmt.Errorf("outbox: %s.%s (%v) exceeds %s (%v)", config, loName, lo, hiName, hi)
	}
	return nil
}
