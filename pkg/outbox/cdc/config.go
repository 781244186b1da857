package cdc

import (
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/knob"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/internal/defaults"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
	"github.com/onceflow/onceflow/pkg/outbox/internal/standby"
)

// The log-based relay's own defaults, what a zero Config field means (each
// field's doc comment gives the value); those both relays share are in
// package outbox's internal/defaults.
const (
	// defaultSlot is the replication slot's name.
	defaultSlot = "onceflow_outbox"
	// defaultFlushDelay is how long committed events wait for more to join
	// their batch.
	defaultFlushDelay = 2 * time.Millisecond
	// defaultStatusInterval is how often the relay reports its confirmed
	// position to the server.
	defaultStatusInterval = time.Second
	// defaultLagInterval is how often the slot's gauges are refreshed.
	defaultLagInterval = 2 * time.Second
	// defaultRetentionInterval is how often confirmed rows are deleted.
	defaultRetentionInterval = 5 * time.Second
	// defaultRetentionBatch is the most rows one retention DELETE removes.
	defaultRetentionBatch = 1000
	// defaultRetain is how long confirmed rows stay after their insert.
	defaultRetain = time.Minute
	// defaultMaxAttempts is how many writes that failed because of the
	// message an event gets before it is skipped as dead. Fewer than the
	// polling relay's (outbox.RelayConfig.MaxAttempts), with a shorter
	// backoff (defaultBackoffMax): a stream cannot set one event aside and go on
	// with the other aggregates, so every attempt holds up its topic.
	defaultMaxAttempts = 3
	// defaultBackoffMax caps the delay between those attempts.
	defaultBackoffMax = 2 * time.Second
	// defaultOutageBackoffMax caps the delay while Kafka or Postgres is
	// unreachable, and between a standby's tries to take the slot.
	defaultOutageBackoffMax = 5 * time.Second
)

// maxInFlightPerBatch is MaxInFlight's default in batches.
const maxInFlightPerBatch = 4

// Config configures a Relay. Zero fields take the documented defaults;
// negative sizes and durations are refused (outbox.RelayConfig's convention).
type Config struct {
	// Slot is the logical replication slot (pgoutput) the relay reads and
	// creates if it is missing. Slot names are global to the Postgres
	// cluster: give each service's outbox its own. Only lower-case letters,
	// digits and underscores. Default "onceflow_outbox".
	Slot string
	// ReplicationURL is the connection string of a role with the
	// REPLICATION attribute (the walsender connection). Default: the pool's
	// own connection settings.
	ReplicationURL string
	// Topic maps an aggregate type to its Kafka topic.
	// Default: aggregateType + ".events".
	Topic func(aggregateType string) string
	// Mode is what the service writes: outbox.ModeCDC (Enqueue: rows, the
	// default) or outbox.ModeWAL (Emit: the WAL only). It decides what a lost slot
	// costs: in outbox.ModeCDC the relay republishes the gap from the table; in
	// ModeWAL the gap's events exist nowhere else, and the relay reports
	// them lost (outbox_slot_lost_unrecoverable_total).
	Mode outbox.RelayMode
	// BatchSize is the most events written to Kafka at once.
	// Default 500.
	BatchSize int
	// MaxInFlight is the most events of one topic decoded and not yet
	// acknowledged by Kafka; with BatchSize it bounds the relay's memory
	// whatever a transaction's size. A topic that cannot be written holds
	// back its own events, and the others flow until its MaxInFlight are
	// waiting; then the stream waits for it. Default 4 × BatchSize.
	MaxInFlight int
	// FlushDelay is how long committed events wait for more to join their
	// batch before they are written, while events flow: an event that finds
	// its topic's lane idle for longer than this goes at once. Default 2ms:
	// the stream usually has the next commit already buffered, and a long
	// delay is pure latency.
	FlushDelay time.Duration
	// StatusInterval is how often the relay reports its confirmed position
	// to the server (and asks for a keepalive while idle, so an idle slot's
	// position follows the server's WAL). It must be well under the server's
	// wal_sender_timeout (default 60s). Default 1s.
	StatusInterval time.Duration
	// LagInterval is how often the slot's gauges (outbox_slot_lag_bytes,
	// outbox_slot_retained_wal_bytes, outbox_slot_wal_keep_size_bytes) and
	// outbox_dead_events are refreshed. Default 2s.
	LagInterval time.Duration
	// RetentionInterval is how often rows of outbox_events that Kafka
	// acknowledged and the slot confirmed are deleted, in batches of
	// RetentionBatch, and the most often the relay records its confirmed
	// position in outbox_cdc_slots, which retention reads. Default 5s.
	RetentionInterval time.Duration
	// RetentionBatch is the most rows one retention DELETE removes.
	// Default 1000.
	RetentionBatch int
	// Retain keeps published rows this long after their insert, for an
	// operator's replay (outboxadmin.Replay) and the replay after a lost slot
	// (the relay republishes every pending row the table still holds; see
	// the runbook). Rows the slot has not confirmed are never deleted,
	// however old: "published" is commit-ordered (internal/lifecycle), so a
	// transaction that inserted a lower id and committed later keeps its
	// row until its own commit is confirmed. Default 1m.
	Retain time.Duration
	// PublishTimeout bounds one write to Kafka; running out of it counts as
	// a broker failure. Default 30s.
	PublishTimeout time.Duration
	// MaxAttempts is how many writes that failed because of the message (too
	// large, refused by a topic policy, …) an event gets before it is
	// skipped as dead: a stream cannot set one event aside and go on with
	// its aggregate later, as the polling relay does.
	// Default 3.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the delay between those attempts.
	// Defaults 100ms and 2s.
	BackoffMin, BackoffMax time.Duration
	// OutageBackoffMin and OutageBackoffMax bound the capped, jittered delay
	// while Kafka or Postgres is unreachable, and between a standby's tries
	// to take the slot. Defaults 100ms and 5s.
	OutageBackoffMin, OutageBackoffMax time.Duration
	// LogInterval is the most often an ongoing failure is logged.
	// Default 30s.
	LogInterval time.Duration
	// OnSlotLost, if set, is called after the relay replaced a lost slot,
	// with the window no slot streamed, before the relay republishes it
	// (table mode) or after it counted it lost (WAL-only mode).
	OnSlotLost func(LostSlot)
	// Logger receives failures, takeovers and lost slots. Default: slog.Default().
	Logger *slog.Logger
	// Metrics receives the relay's metrics. Default: none.
	Metrics *outbox.Metrics
	// Standby makes the relay publish a transaction only once the standbys
	// have flushed its commit (internal/standby); on PostgreSQL 17,
	// synchronized_standby_slots on the primary does the same for every
	// logical walsender. Default: off.
	Standby outbox.Standby
}

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// WithDefaults returns c with every zero field set to its documented
// default. Negative values are kept, for Validate to refuse.
func (c Config) WithDefaults() Config {
	knob.Default(&c.Slot, defaultSlot)
	if c.Topic == nil {
		c.Topic = publish.DefaultTopic
	}
	knob.Default(&c.Mode, outbox.ModeCDC)
	knob.Default(&c.BatchSize, defaults.BatchSize)
	knob.Default(&c.MaxInFlight, maxInFlightPerBatch*c.BatchSize)
	knob.Default(&c.RetentionBatch, defaultRetentionBatch)
	knob.Default(&c.MaxAttempts, defaultMaxAttempts)
	knob.Default(&c.FlushDelay, defaultFlushDelay)
	knob.Default(&c.StatusInterval, defaultStatusInterval)
	knob.Default(&c.LagInterval, defaultLagInterval)
	knob.Default(&c.RetentionInterval, defaultRetentionInterval)
	knob.Default(&c.Retain, defaultRetain)
	knob.Default(&c.PublishTimeout, defaults.PublishTimeout)
	knob.Default(&c.BackoffMin, defaults.BackoffMin)
	knob.Default(&c.BackoffMax, defaultBackoffMax)
	knob.Default(&c.OutageBackoffMin, defaults.OutageBackoffMin)
	knob.Default(&c.OutageBackoffMax, defaultOutageBackoffMax)
	knob.Default(&c.LogInterval, defaults.LogInterval)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = outbox.NewMetrics(nil)
	}
	return c
}

// Validate reports the first field of c that no log-based relay can run
// with: a negative size or duration, a slot name Postgres refuses, a mode
// that is not log-based, or crossed backoff bounds. It checks c as
// NewRelay would use it, after WithDefaults.
func (c Config) Validate() error {
	const name = "outbox: cdc.Config"
	if err := knob.RefuseNegative(name, c); err != nil {
		return err
	}
	if err := standby.Config(c.Standby).Validate(name); err != nil {
		return err
	}
	d := c.WithDefaults()
	if !slotName.MatchString(d.Slot) {
		return fmt.Errorf("outbox: slot name %q: only a-z, 0-9 and _, at most 63", d.Slot)
	}
	if d.Mode != outbox.ModeCDC && d.Mode != outbox.ModeWAL {
		return fmt.Errorf("outbox: cdc.Config.Mode must be %s or %s, got %q", outbox.ModeCDC, outbox.ModeWAL, d.Mode)
	}
	if err := knob.RefuseCrossed(name, "BackoffMin", d.BackoffMin, "BackoffMax", d.BackoffMax); err != nil {
		return err
	}
	return knob.RefuseCrossed(name, "OutageBackoffMin", d.OutageBackoffMin, "OutageBackoffMax", d.OutageBackoffMax)
}
