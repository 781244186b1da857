package outbox

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/internal/knob"
	"github.com/onceflow/onceflow/pkg/outbox/internal/defaults"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
	"github.com/onceflow/onceflow/pkg/outbox/internal/standby"
)

// Both relays' configs (RelayConfig, cdc.Config) follow one convention, as
// PruneConfig and the inbox's configs do: a zero field means its documented
// default, whose value its doc comment gives; a negative size or duration
// is an error from Validate, because a typo'd sign must not quietly become
// the default. WithDefaults fills the zero fields and keeps the negative
// ones for Validate to see; the constructors call both (pkg/internal/knob).

// The polling relay's own defaults, what a zero RelayConfig field means;
// those both relays share are in internal/defaults.
const (
	// defaultPollInterval is how often an idle relay claims without a
	// commit notification.
	defaultPollInterval = time.Second
	// defaultLinger is how long a busy relay lets a batch gather.
	defaultLinger = time.Millisecond
	// defaultRebalanceInterval is how often a relay heartbeats, rebalances
	// and refreshes the backlog gauges.
	defaultRebalanceInterval = 2 * time.Second
	// defaultLockTimeout bounds a claim's wait for rows another relay holds.
	defaultLockTimeout = 10 * time.Second
	// defaultMaxAttempts is how many publishes that failed because of the
	// message make a row dead. The log-based relay gives an event fewer
	// (cdc.Config.MaxAttempts): the polling relay sets a failing row aside
	// and goes on with the other aggregates, a stream waits for it.
	defaultMaxAttempts = 10
	// defaultBackoffMax caps the delay before such a row is tried again.
	defaultBackoffMax = time.Minute
	// defaultOutageBackoffMax caps the delay with which the relay retries
	// an unreachable Kafka or Postgres; publishing resumes about this long
	// after Kafka is back.
	defaultOutageBackoffMax = 10 * time.Second
)

// relayTTLPerRebalance is RelayTTL's default in heartbeats: a relay counts
// as live until it missed this many.
const relayTTLPerRebalance = 3

// RelayConfig configures a Relay. Zero fields take the documented defaults;
// negative sizes and durations are refused (see above).
type RelayConfig struct {
	// ID names this relay instance among those sharing the outbox.
	// Default: hostname-pid-random.
	ID string
	// Topic maps an aggregate type to its Kafka topic.
	// Default: aggregateType + ".events".
	Topic func(aggregateType string) string
	// BatchSize is the most rows claimed and published at once.
	// Default 500.
	BatchSize int
	// PollInterval is how often the relay looks for work when no commit
	// notification arrives (the fallback if NOTIFY is lost).
	// Default 1s.
	PollInterval time.Duration
	// Linger is how long a busy relay waits before a claim when it has no
	// backlog: after a commit notification wakes it, and between batches
	// that did not fill BatchSize. Commits that arrive meanwhile ride the
	// same batch, so a steady rate of hundreds a second costs fewer claims
	// and round trips; each event waits up to Linger longer. The relay
	// lingers only while its recent rate says more commits are coming
	// within Linger (at least one per 4 × Linger), so at low rates it adds
	// nothing. Default 1ms.
	Linger time.Duration
	// RebalanceInterval is how often the relay heartbeats and rebalances its
	// share of the partitions, and refreshes the backlog gauges, each on a
	// goroutine of its own beside the claim loop.
	// Default 2s.
	RebalanceInterval time.Duration
	// RelayTTL is how long a relay that stopped heartbeating still counts as
	// live. Default 3 × RebalanceInterval. (A relay that dies releases its
	// partitions at once; the TTL only delays the others' larger share.)
	RelayTTL time.Duration
	// LockTimeout bounds how long a claim waits for rows another relay still
	// holds during a handover. Default 10s.
	LockTimeout time.Duration
	// PublishTimeout bounds one batch's writes to Kafka; a batch that runs
	// out of it is treated as a broker failure (its rows stay pending,
	// uncharged), so a stalled broker cannot hold a claim open for long.
	// Default 30s.
	PublishTimeout time.Duration
	// MaxAttempts is how many publishes failed because of the message (see
	// the package documentation for which errors those are) make a row dead.
	// Default 10.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the exponential, jittered delay before
	// a row whose publish failed because of the message is retried.
	// Defaults 100ms and 1m.
	BackoffMin, BackoffMax time.Duration
	// OutageBackoffMin and OutageBackoffMax bound the exponential, jittered
	// delay with which the relay as a whole retries while Kafka or Postgres
	// is unreachable; such failures are never charged to a row. The maximum
	// is also about how long publishing resumes after Kafka is back.
	// Defaults 100ms and 10s.
	OutageBackoffMin, OutageBackoffMax time.Duration
	// LogInterval is the most often the relay logs that a failure goes on
	// (the first failure and the recovery are always logged).
	// Default 30s.
	LogInterval time.Duration
	// Logger receives failures, dead rows and rebalances. Default: slog.Default().
	Logger *slog.Logger
	// Metrics receives the relay's metrics. Default: none.
	Metrics *Metrics
	// Standby makes the relay publish only what the standbys have flushed
	// (internal/standby). Default: off, publish what the primary committed.
	Standby Standby
}

// WithDefaults returns c with every zero field set to its documented
// default. Negative values are kept, for Validate to refuse.
func (c RelayConfig) WithDefaults() RelayConfig {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if c.Topic == nil {
		c.Topic = publish.DefaultTopic
	}
	knob.Default(&c.BatchSize, defaults.BatchSize)
	knob.Default(&c.PollInterval, defaultPollInterval)
	knob.Default(&c.RebalanceInterval, defaultRebalanceInterval)
	knob.Default(&c.RelayTTL, relayTTLPerRebalance*c.RebalanceInterval)
	knob.Default(&c.LockTimeout, defaultLockTimeout)
	knob.Default(&c.PublishTimeout, defaults.PublishTimeout)
	knob.Default(&c.MaxAttempts, defaultMaxAttempts)
	knob.Default(&c.BackoffMin, defaults.BackoffMin)
	knob.Default(&c.BackoffMax, defaultBackoffMax)
	knob.Default(&c.OutageBackoffMin, defaults.OutageBackoffMin)
	knob.Default(&c.OutageBackoffMax, defaultOutageBackoffMax)
	knob.Default(&c.LogInterval, defaults.LogInterval)
	knob.Default(&c.Linger, defaultLinger)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	return c
}

// Validate reports the first field of c that no relay can run with: a
// negative size or duration, or a combination that defeats its purpose. It
// checks c as NewRelay would use it, after WithDefaults.
func (c RelayConfig) Validate() error {
	const name = "outbox: RelayConfig"
	if err := knob.RefuseNegative(name, c); err != nil {
		return err
	}
	if err := standby.Config(c.Standby).Validate(name); err != nil {
		return err
	}
	d := c.WithDefaults()
	if d.RelayTTL <= d.RebalanceInterval {
		// A relay heartbeats every RebalanceInterval; a TTL no longer than
		// that declares live relays dead between two heartbeats, and the
		// partitions flap between them.
		return fmt.Errorf("outbox: RelayConfig.RelayTTL (%v) must exceed RebalanceInterval (%v)", d.RelayTTL, d.RebalanceInterval)
	}
	if err := knob.RefuseCrossed(name, "BackoffMin", d.BackoffMin, "BackoffMax", d.BackoffMax); err != nil {
		return err
	}
	return knob.RefuseCrossed(name, "OutageBackoffMin", d.OutageBackoffMin, "OutageBackoffMax", d.OutageBackoffMax)
}
