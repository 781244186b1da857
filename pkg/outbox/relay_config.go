package outbox

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/google/uuid"
)

// RelayConfig configures a Relay. Zero fields take the documented defaults.
type RelayConfig struct {
	// ID names this relay instance among those sharing the outbox.
	// Default: hostname-pid-random.
	ID string
	// Topic maps an aggregate type to its Kafka topic.
	// Default: aggregateType + ".events".
	Topic func(aggregateType string) string
	// BatchSize is the most rows claimed and published at once. Default 500.
	BatchSize int
	// PollInterval is how often the relay looks for work when no commit
	// notification arrives (the fallback if NOTIFY is lost). Default 1s.
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
	// goroutine of its own beside the claim loop. Default 2s.
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
	// (the first failure and the recovery are always logged). Default 30s.
	LogInterval time.Duration
	// CrashPoint, when set, is called at each named crash point (see
	// CrashAfterAck); a non-nil error aborts the batch right there, as a
	// crash would. Fault-injection harnesses use it; leave it nil otherwise.
	CrashPoint func(name string) error
	// Logger receives failures, dead rows and rebalances. Default: slog.Default().
	Logger *slog.Logger
	// Metrics receives the relay's metrics. Default: none.
	Metrics *Metrics
}

// WithDefaults returns c with every zero field set to its documented
// default. Negative values are kept, for Validate to refuse: a typo'd sign
// must not quietly become the default.
func (c RelayConfig) WithDefaults() RelayConfig {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if c.Topic == nil {
		c.Topic = func(t string) string { return t + ".events" }
	}
	if c.BatchSize == 0 {
		c.BatchSize = 500
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.RebalanceInterval == 0 {
		c.RebalanceInterval = 2 * time.Second
	}
	if c.RelayTTL == 0 {
		c.RelayTTL = 3 * c.RebalanceInterval
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = 10 * time.Second
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 30 * time.Second
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = 100 * time.Millisecond
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = time.Minute
	}
	if c.OutageBackoffMin == 0 {
		c.OutageBackoffMin = 100 * time.Millisecond
	}
	if c.OutageBackoffMax == 0 {
		c.OutageBackoffMax = 10 * time.Second
	}
	if c.LogInterval == 0 {
		c.LogInterval = defaultLogInterval
	}
	if c.Linger == 0 {
		c.Linger = time.Millisecond
	}
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
	for _, f := range []struct {
		name string
		v    any
		neg  bool
	}{
		{"BatchSize", c.BatchSize, c.BatchSize < 0},
		{"PollInterval", c.PollInterval, c.PollInterval < 0},
		{"RebalanceInterval", c.RebalanceInterval, c.RebalanceInterval < 0},
		{"RelayTTL", c.RelayTTL, c.RelayTTL < 0},
		{"LockTimeout", c.LockTimeout, c.LockTimeout < 0},
		{"PublishTimeout", c.PublishTimeout, c.PublishTimeout < 0},
		{"MaxAttempts", c.MaxAttempts, c.MaxAttempts < 0},
		{"BackoffMin", c.BackoffMin, c.BackoffMin < 0},
		{"BackoffMax", c.BackoffMax, c.BackoffMax < 0},
		{"OutageBackoffMin", c.OutageBackoffMin, c.OutageBackoffMin < 0},
		{"OutageBackoffMax", c.OutageBackoffMax, c.OutageBackoffMax < 0},
		{"LogInterval", c.LogInterval, c.LogInterval < 0},
		{"Linger", c.Linger, c.Linger < 0},
	} {
		if f.neg {
			return fmt.Errorf("outbox: RelayConfig.%s is negative (%v); leave it zero for the default", f.name, f.v)
		}
	}
	d := c.WithDefaults()
	switch {
	case d.RelayTTL <= d.RebalanceInterval:
		// A relay heartbeats every RebalanceInterval; a TTL no longer than
		// that declares live relays dead between two heartbeats, and the
		// partitions flap between them.
		return fmt.Errorf("outbox: RelayConfig.RelayTTL (%v) must exceed RebalanceInterval (%v)", d.RelayTTL, d.RebalanceInterval)
	case d.BackoffMin > d.BackoffMax:
		return fmt.Errorf("outbox: RelayConfig.BackoffMin (%v) exceeds BackoffMax (%v)", d.BackoffMin, d.BackoffMax)
	case d.OutageBackoffMin > d.OutageBackoffMax:
		return fmt.Errorf("outbox: RelayConfig.OutageBackoffMin (%v) exceeds OutageBackoffMax (%v)", d.OutageBackoffMin, d.OutageBackoffMax)
	}
	return nil
}
