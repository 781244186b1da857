package inbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
)

// GapPolicy says what to do with an event whose aggregate version is more
// than one above the last one this consumer applied.
type GapPolicy int

const (
	// GapAccept handles the event and reports the gap (metric and log).
	// Right when events may be missing for good (topic retention, a
	// consumer that starts late) and handlers do not depend on every step.
	GapAccept GapPolicy = iota
	// GapRetry treats the gap as transient: the event is retried, waiting
	// for the missing versions, and dead-lettered after MaxAttempts.
	GapRetry
)

// Upcaster converts the payload of EventType from version From to From+1.
// Register one per step; the consumer applies them in a chain, so handlers
// only ever see the current version.
type Upcaster struct {
	EventType string
	From      int
	Convert   func(payload json.RawMessage) (json.RawMessage, error)
}

// Crash points the consumer passes to Config.CrashPoint.
const (
	// CrashAfterCommit is after the database commit and before the offset
	// commit: a crash here redelivers events the inbox already holds.
	CrashAfterCommit = "inbox.after-commit"
)

// Config configures a Consumer. Zero fields take the documented defaults.
type Config struct {
	// Name identifies the consumer; dedupe is per (Name, event id). Required.
	Name string
	// Workers handle messages in parallel, each message going to the worker
	// its key hashes to, so one key (one aggregate) is handled in order.
	// Default 4.
	Workers int
	// BatchSize is the most messages a worker handles in one database
	// transaction (a savepoint each, so one failure does not undo the
	// others). It is also each worker's queue capacity. Default 100.
	BatchSize int
	// DeadLetterTopic receives messages that cannot be handled.
	// Default: the message's topic + ".dlt".
	DeadLetterTopic string
	// MaxAttempts bounds how often a failing handler runs for one message
	// before it is dead-lettered. Default 5.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the jittered exponential delay between
	// attempts. Defaults 50ms and 5s.
	BackoffMin, BackoffMax time.Duration
	// DisableVersionGuard turns off the aggregate-version check, for topics
	// whose events carry no meaningful per-aggregate sequence.
	DisableVersionGuard bool
	// Gaps is the version-gap policy. Default GapAccept.
	Gaps GapPolicy
	// DeadKeys says what happens to the later events of an aggregate whose
	// earlier event is dead (dead-lettered, not yet requeued and applied).
	// Default DeadKeyPark: they are parked, and applied in order once the
	// dead one is requeued and applied. DeadKeySkipAhead applies them at
	// once; only for consumers whose events of one aggregate do not depend
	// on each other (see DeadKeySkipAhead).
	DeadKeys DeadKeyPolicy
	// Upcasters convert older event versions to the current one.
	Upcasters []Upcaster
	// CrashPoint, when set, is called at each named crash point (see
	// CrashAfterCommit); a non-nil error stops the consumer right there, as
	// a crash would. In lease mode it is called from concurrent side
	// effects, so it must be safe for concurrent use. Fault-injection
	// harnesses use it; leave it nil otherwise.
	CrashPoint func(name string) error
	// LeaseTTL is how long a leased message (NewLeaseConsumer) stays with
	// its worker. Every Effect.Check and Effect.Call starts only right after
	// its worker renewed the lease under its fencing token, so a lease must
	// outlast CallTimeout + LeaseMargin (Validate refuses it otherwise).
	// Default 30s.
	LeaseTTL time.Duration
	// CallTimeout bounds each Effect.Check and Effect.Call of a lease-mode
	// consumer: its ctx ends CallTimeout after the renewal that preceded it,
	// so before the lease does. A call cut off by it counts as the other
	// side being unavailable (an outage: waited out, never an attempt), and
	// the next try checks first. Effect.Check and Effect.Call must honour
	// their ctx. Default LeaseTTL/3.
	CallTimeout time.Duration
	// LeaseMargin is how long after a call's ctx ended the call may still
	// take effect on the other side: a request already on the wire, the
	// other side finishing what it received. Leases outlast every call by at
	// least this much, so a worker that takes over an expired lease checks
	// only after the previous holder's last possible call has landed; and a
	// worker whose own call failed checks, before trying again, no sooner
	// than this after it. Default LeaseTTL/10.
	LeaseMargin time.Duration
	// MaxInFlight bounds the side-effect calls (Effect.Check and
	// Effect.Call) a lease-mode consumer makes at once, across its workers:
	// the most load it puts on the other side. The messages of one key are
	// called one after the other, in order; distinct keys of a batch are
	// called concurrently up to this limit. 1 makes one call at a time.
	// Default 16.
	MaxInFlight int
	// LeaseOwner names this process in lease rows. Default: Name + a random suffix.
	LeaseOwner string
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
	// Logger receives failures and dead letters. Default: slog.Default().
	Logger *slog.Logger
	// Metrics receives the consumer's metrics. Default: none.
	Metrics *Metrics
}

// WithDefaults returns c with every zero field set to its documented
// default. Negative values are kept, for Validate to refuse: a typo'd sign
// must not quietly become the default.
func (c Config) WithDefaults() Config {
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = 50 * time.Millisecond
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = 5 * time.Second
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 30 * time.Second
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = c.LeaseTTL / 3
	}
	if c.LeaseMargin == 0 {
		c.LeaseMargin = c.LeaseTTL / 10
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 16
	}
	if c.LeaseOwner == "" {
		c.LeaseOwner = c.Name + "-" + uuid.NewString()[:8]
	}
	if c.LagInterval == 0 {
		c.LagInterval = 5 * time.Second
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.ErrorLogInterval == 0 {
		c.ErrorLogInterval = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	return c
}

// Validate reports the first field of c that no consumer can run with: a
// missing Name, a negative count or duration, an unknown gap policy,
// backoff bounds the wrong way round, or a LeaseTTL that does not outlast
// CallTimeout + LeaseMargin. It checks c as NewConsumer would use
// it, after WithDefaults.
func (c Config) Validate() error {
	if c.Name == "" {
		return errors.New("inbox: Config.Name is required")
	}
	for _, f := range []struct {
		name string
		v    any
		neg  bool
	}{
		{"Workers", c.Workers, c.Workers < 0},
		{"BatchSize", c.BatchSize, c.BatchSize < 0},
		{"MaxAttempts", c.MaxAttempts, c.MaxAttempts < 0},
		{"BackoffMin", c.BackoffMin, c.BackoffMin < 0},
		{"BackoffMax", c.BackoffMax, c.BackoffMax < 0},
		{"LeaseTTL", c.LeaseTTL, c.LeaseTTL < 0},
		{"CallTimeout", c.CallTimeout, c.CallTimeout < 0},
		{"LeaseMargin", c.LeaseMargin, c.LeaseMargin < 0},
		{"MaxInFlight", c.MaxInFlight, c.MaxInFlight < 0},
		{"LagInterval", c.LagInterval, c.LagInterval < 0},
		{"ShutdownGrace", c.ShutdownGrace, c.ShutdownGrace < 0},
		{"ErrorLogInterval", c.ErrorLogInterval, c.ErrorLogInterval < 0},
	} {
		if f.neg {
			return fmt.Errorf("inbox: Config.%s is negative (%v); leave it zero for the default", f.name, f.v)
		}
	}
	if c.Gaps != GapAccept && c.Gaps != GapRetry {
		return fmt.Errorf("inbox: Config.Gaps is %d, neither GapAccept nor GapRetry", c.Gaps)
	}
	if c.DeadKeys != DeadKeyPark && c.DeadKeys != DeadKeySkipAhead {
		return fmt.Errorf("inbox: Config.DeadKeys is %d, neither DeadKeyPark nor DeadKeySkipAhead", c.DeadKeys)
	}
	d := c.WithDefaults()
	if d.BackoffMin > d.BackoffMax {
		return fmt.Errorf("inbox: Config.BackoffMin (%v) exceeds BackoffMax (%v)", d.BackoffMin, d.BackoffMax)
	}
	if d.CallTimeout+d.LeaseMargin >= d.LeaseTTL {
		// A call could then still be running, or landing, when its lease
		// expires and another worker takes the message over.
		return fmt.Errorf("inbox: Config.LeaseTTL (%v) must exceed CallTimeout (%v) + LeaseMargin (%v): "+
			"a side-effect call must end, and land, before its lease can be taken over", d.LeaseTTL, d.CallTimeout, d.LeaseMargin)
	}
	return nil
}
