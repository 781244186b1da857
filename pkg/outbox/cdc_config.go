package outbox

import (
	"fmt"
	"log/slog"
	"regexp"
	"time"
)

// CDCConfig configures a CDCRelay. Zero fields take the documented defaults.
type CDCConfig struct {
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
	// Mode is what the service writes: ModeCDC (Enqueue: rows, the
	// default) or ModeWAL (Emit: the WAL only). It decides what a lost slot
	// costs: in ModeCDC the relay republishes the gap from the table; in
	// ModeWAL the gap's events exist nowhere else, and the relay reports
	// them lost (outbox_slot_lost_unrecoverable_total).
	Mode RelayMode
	// BatchSize is the most events written to Kafka at once. Default 500.
	BatchSize int
	// MaxInFlight is the most events of one topic decoded and not yet
	// acknowledged by Kafka; with BatchSize it bounds the relay's memory
	// whatever a transaction's size. A topic that cannot be written holds
	// back its own events, and the others flow until its MaxInFlight are
	// waiting; then the stream waits for it. Default 4 × BatchSize.
	MaxInFlight int
	// FlushDelay is how long committed events wait for more to join their
	// batch before they are written. Default 2ms: the stream usually has
	// the next commit already buffered, and a long delay is pure latency.
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
	// RetentionBatch (default 1000). Default 5s.
	RetentionInterval time.Duration
	// RetentionBatch is the most rows one retention DELETE removes.
	RetentionBatch int
	// Retain keeps confirmed rows this long after their insert, for the
	// replay after a lost slot (the relay republishes every pending row the
	// table still holds; see the runbook) and for a transaction that
	// inserted a lower id but committed later (it is in the WAL, so the
	// relay publishes it either way; only the table copy would go early).
	// Default 1m.
	Retain time.Duration
	// PublishTimeout bounds one write to Kafka; running out of it counts as
	// a broker failure. Default 30s.
	PublishTimeout time.Duration
	// MaxAttempts is how many writes that failed because of the message (too
	// large, refused by a topic policy, …) an event gets before it is
	// skipped as dead: a stream cannot set one event aside and go on with
	// its aggregate later, as the polling relay does. Default 3.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the delay between those attempts.
	// Defaults 100ms and 2s.
	BackoffMin, BackoffMax time.Duration
	// OutageBackoffMin and OutageBackoffMax bound the capped, jittered delay
	// while Kafka or Postgres is unreachable, and between a standby's tries
	// to take the slot. Defaults 100ms and 5s.
	OutageBackoffMin, OutageBackoffMax time.Duration
	// LogInterval is the most often an ongoing failure is logged. Default 30s.
	LogInterval time.Duration
	// OnSlotLost, if set, is called after the relay replaced a lost slot,
	// with the window no slot streamed, before the relay republishes it
	// (table mode) or after it counted it lost (WAL-only mode).
	OnSlotLost func(LostSlot)
	// CrashPoint, when set, is called at CrashAfterAck (Kafka acknowledged a
	// batch, the slot is not yet confirmed); a non-nil error drops the
	// connection there, as a crash would. For fault-injection harnesses.
	CrashPoint func(name string) error
	// Logger receives failures, takeovers and lost slots. Default: slog.Default().
	Logger *slog.Logger
	// Metrics receives the relay's metrics. Default: none.
	Metrics *Metrics
}

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

func (c CDCConfig) withDefaults() (CDCConfig, error) {
	if c.Slot == "" {
		c.Slot = "onceflow_outbox"
	}
	if !slotName.MatchString(c.Slot) {
		return c, fmt.Errorf("outbox: slot name %q: only a-z, 0-9 and _, at most 63", c.Slot)
	}
	if c.Topic == nil {
		c.Topic = func(t string) string { return t + ".events" }
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	switch c.Mode {
	case "":
		c.Mode = ModeCDC
	case ModeCDC, ModeWAL:
	default:
		return c, fmt.Errorf("outbox: CDCConfig.Mode must be %s or %s, got %q", ModeCDC, ModeWAL, c.Mode)
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 4 * c.BatchSize
	}
	if c.RetentionBatch <= 0 {
		c.RetentionBatch = 1000
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 3
	}
	def(&c.FlushDelay, 2*time.Millisecond)
	def(&c.StatusInterval, time.Second)
	def(&c.LagInterval, 2*time.Second)
	def(&c.RetentionInterval, 5*time.Second)
	def(&c.Retain, time.Minute)
	def(&c.PublishTimeout, 30*time.Second)
	def(&c.BackoffMin, 100*time.Millisecond)
	def(&c.BackoffMax, 2*time.Second)
	def(&c.OutageBackoffMin, 100*time.Millisecond)
	def(&c.OutageBackoffMax, 5*time.Second)
	def(&c.LogInterval, defaultLogInterval)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	return c, nil
}
