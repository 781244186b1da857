package engine

import (
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/knob"
)

// Upcaster converts the payload of EventType from version From to From+1.
// Register one per step; the consumer applies them in a chain, so handlers
// only ever see the current version.
type Upcaster struct {
	EventType string
	From      int
	Convert   func(payload json.RawMessage) (json.RawMessage, error)
}

// The defaults of Config's fields, which a zero field takes.
const (
	DefaultWorkers          = 4
	DefaultBatchSize        = 100
	DefaultMaxAttempts      = 5
	DefaultBackoffMin       = 50 * time.Millisecond
	DefaultBackoffMax       = 5 * time.Second
	DefaultLagInterval      = 5 * time.Second
	DefaultShutdownGrace    = 10 * time.Second
	DefaultErrorLogInterval = 30 * time.Second
	// DefaultDeadLetterRetention is Kafka's default retention.ms (7 days).
	DefaultDeadLetterRetention = 7 * 24 * time.Hour
)

// Config configures a Consumer, in either mode (a lease-mode consumer's own
// knobs are in pkg/inbox/lease's Config). Zero fields take the documented defaults;
// negative ones are refused by Validate.
type Config struct {
	// Name identifies the consumer; dedupe is per (Name, event id). Required.
	Name string

	// Dispatching: how fetched messages reach the applier.

	// Workers handle messages in parallel, each message going to the worker
	// its key hashes to, so one key (one aggregate) is handled in order.
	// Default 4.
	Workers int
	// BatchSize is the most messages a worker hands its applier at once
	// (the transactional applier handles them in one database transaction,
	// with a savepoint each when one fails, so one failure does not undo
	// the others; the lease applier leases and marks them done in one
	// transaction each). It is also each worker's queue capacity. Default
	// 100.
	BatchSize int

	// Applying, in both modes: retries, dead letters, the version guard,
	// parking, upcasting.

	// MaxAttempts bounds how often a failing handler (or side effect) runs
	// for one message before it is dead-lettered. Default 5.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the jittered exponential delay between
	// attempts, and between retries through an outage. Defaults
	// 50ms and 5s.
	BackoffMin, BackoffMax time.Duration
	// DeadLetterTopic receives messages that cannot be handled.
	// Default: the message's topic + ".dlt".
	DeadLetterTopic string
	// DisableVersionGuard turns off the aggregate-version check, for topics
	// whose events carry no meaningful per-aggregate sequence.
	DisableVersionGuard bool
	// AcceptGaps says what happens to an event whose aggregate version is
	// more than one above the last one this consumer applied: a later
	// version over a missing earlier one.
	//
	// Default false: it waits for the missing versions a bounded time. The
	// event is retried with backoff (MaxAttempts, BackoffMin, BackoffMax),
	// and then dead-lettered, visibly, with the gap as its reason; its
	// aggregate's later events park behind it (SkipAheadOfDead) until an
	// operator requeues it (it is then applied whatever the guard says) or
	// releases the aggregate. A missing earlier version that arrives
	// meanwhile is applied (it comes before the dead one). Nothing jumps
	// ahead: a refund is never forwarded over a capture that never came.
	//
	// True handles the event at once and reports the gap (metric and log):
	// an explicit opt-in, right when events may be missing for good (topic
	// retention, a consumer that starts late) and handlers do not depend on
	// every step.
	AcceptGaps bool
	// SkipStale says what happens to an event at or below the aggregate
	// version this consumer already applied that is not a redelivery
	// (another event id): an older event arriving after a newer one was
	// applied.
	//
	// Default false: it is dead-lettered with its reason ("version N
	// arrived after version M was applied", reason label stale), without
	// holding its aggregate back: nothing vanishes silently, and an
	// operator who requeues it has it applied whatever the guard says.
	//
	// True skips it, marked stale in the inbox and counted
	// (inbox_stale_total): an explicit opt-in, for consumers that keep only
	// the latest state of an aggregate and lose nothing by it.
	SkipStale bool
	// SkipAheadOfDead says what happens to the later events of an
	// aggregate whose earlier event is dead (dead-lettered, not yet
	// requeued and applied).
	//
	// Default false: they are parked until the dead one is requeued and
	// applied, then applied in order. The only safe choice when a later
	// event depends on an earlier one (a refund on its capture, a status on
	// the order's creation).
	//
	// True applies them at once, as if the dead message were not there; a
	// requeued dead message is still applied when it comes back, after its
	// successors. Only for consumers whose events of one aggregate are
	// independent of each other or carry the whole state (a projection
	// that keeps the latest snapshot, notifications, an audit log).
	SkipAheadOfDead bool
	// Upcasters convert older event versions to the current one.
	Upcasters []Upcaster

	// CommitReplicated makes the consumer commit its Kafka offsets only
	// for messages whose database work every standby has flushed
	// (PostgreSQL streaming replication, followed through the standbys'
	// physical slots, as the outbox's Standby.PublishReplicated does). With
	// an asynchronous standby a failover loses the primary's last commits;
	// without this, the offsets of the messages they applied survive in
	// Kafka and those messages are never delivered again (a charge lost
	// for good); with it, Kafka's committed offsets stay behind them, and
	// a consumer that finds its database on another server than its
	// uncommitted work was done on (its address or start time changed: a
	// failover, or a restart) drops those offsets and rejoins its group,
	// so it reads the messages again from the committed ones: what
	// survived is absorbed as a duplicate, what was lost is applied on the
	// promoted server (inbox_server_switches_total counts it). Each commit
	// of offsets then reads the standbys' position
	// once (every GroupConfig.CommitInterval) and waits for them up to
	// CommitInterval; while they are behind or down, offsets stay where
	// they are (the messages are handled meanwhile, and redelivered after
	// a rebalance, which the inbox absorbs) and the outage is reported
	// (inbox_standby_connected 0, inbox_standby_errors_total, a WARN log
	// line). Default false.
	CommitReplicated bool
	// StandbySlots names the physical slots whose standbys count for
	// CommitReplicated. Default: every physical slot on the primary.
	StandbySlots []string

	// Running: shutdown, outages, observability, fault injection.

	// LagInterval is how often consumer_lag_messages and
	// inbox_dead_letters are refreshed. Default 5s.
	LagInterval time.Duration
	// ShutdownGrace is how long the work in hand may go on after Run's ctx
	// ended (a SIGTERM): a batch being handled, a retry, a dead letter being
	// published. After it, unfinished messages are abandoned uncommitted and
	// redelivered later. Default 10s.
	ShutdownGrace time.Duration
	// ErrorLogInterval bounds how often an outage is logged: its first
	// failure, then one line per interval with a count, then its end.
	// Default 30s.
	ErrorLogInterval time.Duration
	// DeadLetterRetention is how long the dead-letter topic keeps a letter
	// (its retention.ms): set it to the topic's. A hold older than this
	// whose letter is only in the topic (no kept original) has most likely
	// lost it: no requeue can bring the event back, yet its row is still
	// dead_lettered. inbox_holds_past_dead_letter_retention counts those,
	// for the InboxDeadLetterPastRetention alert; an operator then
	// releases or skips the aggregate (ReleaseHeld, SkipHeld). Default
	// 7 days (Kafka's default retention.ms).
	DeadLetterRetention time.Duration
	// Logger receives failures and dead letters. Default: slog.Default().
	Logger *slog.Logger
	// Metrics receives the consumer's metrics. Default: none.
	Metrics *Metrics
}

// WithDefaults returns c with every zero field set to its documented
// default. Negative values are kept, for Validate to refuse: a typo'd sign
// must not quietly become the default.
func (c Config) WithDefaults() Config {
	knob.Default(&c.Workers, DefaultWorkers)
	knob.Default(&c.BatchSize, DefaultBatchSize)
	knob.Default(&c.MaxAttempts, DefaultMaxAttempts)
	knob.Default(&c.BackoffMin, DefaultBackoffMin)
	knob.Default(&c.BackoffMax, DefaultBackoffMax)
	knob.Default(&c.LagInterval, DefaultLagInterval)
	knob.Default(&c.ShutdownGrace, DefaultShutdownGrace)
	knob.Default(&c.ErrorLogInterval, DefaultErrorLogInterval)
	knob.Default(&c.DeadLetterRetention, DefaultDeadLetterRetention)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	return c
}

// Validate reports the first field of c that no consumer can run with: a
// missing Name, a negative count or duration, or backoff bounds the wrong
// way round. It checks c as
// NewConsumer would use it, after WithDefaults.
func (c Config) Validate() error {
	if c.Name == "" {
		return errors.New("inbox: Config.Name is required")
	}
	const name = "inbox: Config"
	if err := knob.RefuseNegative(name, c); err != nil {
		return err
	}
	d := c.WithDefaults()
	return knob.RefuseCrossed(name, "BackoffMin", d.BackoffMin, "BackoffMax", d.BackoffMax)
}
