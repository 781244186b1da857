package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/kafkaerr"
	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// Writer is the part of *kafka.Writer the relay needs. It must return only
// after the broker acknowledged (RequiredAcks = RequireAll). A *kafka.Writer
// or a wrapper with KafkaWriter() *kafka.Writer is given no more in one call than fits one record
// batch per partition, so that the broker judges an aggregate's events of
// the call together (see writeTopic); a Writer of another type that splits
// calls must keep each key's messages of one call together itself.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// notifyChannel is where the insert trigger (migrations 0001 and 0004) and
// the operator functions wake the relays.
const notifyChannel = "outbox_events"

// wakeRelays is run by operator functions that make rows due without
// inserting them (requeue, replay), so relays need not wait for their poll.
const wakeRelays = `SELECT pg_notify('` + notifyChannel + `', '')`

// Crash points the relay passes to RelayConfig.CrashPoint.
const (
	// CrashAfterAck is between the broker's acknowledgement and marking the
	// rows published: a crash here republishes the batch after restart.
	CrashAfterAck = "outbox.after-ack"
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

// defaultLogInterval is RelayConfig.LogInterval's default, and WatchBacklog's.
const defaultLogInterval = 30 * time.Second

// Relay publishes pending outbox rows to Kafka and marks them published only
// after the broker acknowledged them. See the package documentation for what
// it guarantees; several relays may share one outbox.
type Relay struct {
	pool   *pgxpool.Pool
	writer Writer
	cfg    RelayConfig
	owner  *owner

	// Followed for bounded-rate logs and for Health.
	kafka, claims, heartbeat, gauges, listening *outage

	// Used only by the claim loop (or relayOneBatch's caller): how many batches
	// in a row Kafka refused as a whole; how many writes to each topic in a
	// row failed because of the broker; the aggregate types whose rows were
	// deferred, by topic; and the aggregate types whose deferred rows are to
	// be made due again because their topic works again.
	kafkaStreak   int
	topicStreak   map[string]int
	deferredTypes map[string]map[string]bool
	undefer       []string
	// The claim loop's estimate of its rate (noteRate).
	rate   float64
	rateAt time.Time
}

// NewRelay returns a relay reading the outbox in pool and writing to w.
func NewRelay(pool *pgxpool.Pool, w Writer, cfg RelayConfig) (*Relay, error) {
	if pool == nil || w == nil {
		return nil, errors.New("outbox: NewRelay needs a pool and a writer")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	connConfig := pool.Config().ConnConfig
	health := func(what string) *outage { return newOutage(what, cfg.Logger, cfg.LogInterval) }
	return &Relay{
		pool:   pool,
		writer: w,
		cfg:    cfg,
		owner: &owner{
			id:     cfg.ID,
			ttl:    cfg.RelayTTL,
			logger: cfg.Logger,
			dial:   func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, connConfig.Copy()) },
		},
		kafka:         health("publishing to Kafka"),
		claims:        health("claiming from Postgres"),
		heartbeat:     health("heartbeating in Postgres"),
		gauges:        health("refreshing the backlog gauges"),
		listening:     health("listening for commits"),
		topicStreak:   map[string]int{},
		deferredTypes: map[string]map[string]bool{},
	}, nil
}

// Run relays until ctx ends, and returns nil then; an unreachable Kafka or
// Postgres is waited out, never returned. Its work runs on four goroutines,
// in the manner of River's producer, so that a busy claim loop never starves
// the rest:
//   - the claim loop (this goroutine) claims batch after batch while there
//     is work; when it is idle it is armed (see arm) and sleeps until a
//     transaction that wrote outbox rows commits (LISTEN/NOTIFY) or, as a
//     fallback, PollInterval passes;
//   - the listener forwards those notifications;
//   - the heartbeat registers the relay and rebalances its share of the
//     partitions every RebalanceInterval, so a relay that is busy for
//     longer than RelayTTL stays registered and one that joins gets its
//     share at once;
//   - the gauges goroutine refreshes the backlog gauges every
//     RebalanceInterval, so the oldest pending age keeps rising while a busy
//     relay falls behind, and the backlog alert can fire.
func (r *Relay) Run(ctx context.Context) error {
	defer r.owner.leave()
	// Take a share before the first claim, so the relay starts at once.
	r.rebalance(ctx)
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait() // before leave: the heartbeat goroutine uses the lock connection
	wg.Go(func() { r.listen(ctx, wake) })
	wg.Go(func() { r.heartbeatLoop(ctx, wake) })
	wg.Go(func() {
		r.cfg.Metrics.watchBacklog(ctx, r.pool, r.cfg.RebalanceInterval, r.gauges, r.cfg.Metrics.roundTrips.WithLabelValues("gauges"))
	})

	poll := time.NewTimer(0)
	defer poll.Stop()
	armed := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			if r.lingers() && !sleep(ctx, r.cfg.Linger) {
				return nil
			}
		case <-poll.C:
		}
		if r.owner.reregistered.Swap(false) {
			// The heartbeat re-created the registration (it had expired,
			// or this is the first one), and a new registration is unarmed.
			armed = false
		}
		armed = r.drain(ctx, armed, wake)
		poll.Reset(r.cfg.PollInterval)
	}
}

// close releases the relay's partitions and deregisters it, for callers of
// relayOneBatch (this package's tests); Run does this itself when it returns.
func (r *Relay) close() { r.owner.leave() }

// RelayHealth is what a relay knows about its dependencies, for dashboards
// and admin pages. It is not meant for readiness: the relay rides out both
// outages, and the service it runs in can take writes meanwhile.
type RelayHealth struct {
	// KafkaConnected is false while publishing fails because of the broker.
	KafkaConnected bool
	// KafkaDownSince is when the current Kafka outage began (zero if none).
	KafkaDownSince time.Time
	// PostgresConnected is false while claiming or heartbeating fails.
	PostgresConnected bool
	// PostgresDownSince is when the current Postgres failure began (zero if none).
	PostgresDownSince time.Time
	// LastError is the latest error of a current outage ("" if none).
	LastError string
	// OwnedPartitions is how many logical partitions the relay owns now.
	OwnedPartitions int
}

// Health reports the relay's view of Kafka and Postgres now. It is safe to
// call while Run runs.
func (r *Relay) Health() RelayHealth {
	h := RelayHealth{KafkaConnected: true, PostgresConnected: true, OwnedPartitions: len(r.owner.partitions())}
	if down, since, err := r.kafka.state(); down {
		h.KafkaConnected, h.KafkaDownSince, h.LastError = false, since, err.Error()
	}
	for _, o := range []*outage{r.claims, r.heartbeat} {
		if down, since, err := o.state(); down {
			if h.PostgresConnected || since.Before(h.PostgresDownSince) {
				h.PostgresDownSince = since
			}
			h.PostgresConnected, h.LastError = false, err.Error()
		}
	}
	return h
}

// busyRate is the rate of claimed rows (per second) above which an armed
// relay disarms. Armed, every writer's commit notifies, and notifying
// commits queue on a cluster-wide lock (migration 0004); the relay claims
// about once per commit. Disarmed, writers do not notify and the relay
// claims back to back, once per cycle (a few ms: claim, publish, mark).
// Around a few hundred events a second the claims cost the same either
// way, and above it notifying only costs the writers.
const busyRate = 200

// rateWindow is the time constant of the relay's estimate of its rate.
const rateWindow = 100 * time.Millisecond

// noteRate adds n claimed rows to the relay's estimate of its rate, an
// exponentially decaying count over rateWindow, and returns the estimate
// in rows per second. Used only by the claim loop.
func (r *Relay) noteRate(n int, now time.Time) float64 {
	decay := math.Exp(-float64(now.Sub(r.rateAt)) / float64(rateWindow))
	r.rate, r.rateAt = r.rate*decay+float64(n), now
	return r.rate / rateWindow.Seconds()
}

// lingers reports whether the relay should wait Linger before its next
// claim: whether, at its recent rate, at least a quarter of a commit is
// expected meanwhile.
func (r *Relay) lingers() bool {
	return r.noteRate(0, time.Now())*r.cfg.Linger.Seconds() >= 0.25
}

// drain relays batches until the relay is idle, and reports whether it is
// armed then. At a low rate an armed relay stays armed: each commit
// notifies, and each notification costs one claim and two round trips. A
// busy relay disarms, so writers stop notifying while it would claim their
// rows anyway, and arms again when a claim finds nothing.
//
// An armed relay needs no second claim to be sure it missed nothing: every
// commit after arming notifies, and a notification that arrives during a
// batch stays in wake for the next round. A disarmed relay arms in the same
// round trip as its next claim, which then sees every row committed before
// arming (see arm).
//
// Outages are waited out here, with the relay's backoff: a batch that
// Postgres failed, or one whose every row Kafka refused because of the
// broker, makes the whole relay pause before the next claim. The rows of
// such a batch stay pending without an attempt charged (see relayBatch).
func (r *Relay) drain(ctx context.Context, armed bool, wake chan struct{}) bool {
	dbStreak := 0
	armFirst := false
	for ctx.Err() == nil {
		ops := wakeOps{arm: armFirst && !armed, disarmIfBusy: armed}
		res, err := r.relayBatch(ctx, ops)
		switch {
		case res.armed:
			armed = true
		case res.disarmed:
			armed = false
		}
		if err != nil {
			if ctx.Err() != nil {
				return armed
			}
			dbStreak++
			r.cfg.Metrics.dbErrors.WithLabelValues("claim").Inc()
			r.claims.fail(ctx, err)
			if !sleep(ctx, retry.Backoff(dbStreak, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
				return armed
			}
			continue
		}
		dbStreak = 0
		r.claims.ok(ctx)
		if ops.arm && !armed {
			// Not registered (yet, or any more): the poll covers until the
			// heartbeat registers the relay again.
			return false
		}
		armFirst = false
		if r.noteKafka(ctx, res) {
			if !sleep(ctx, retry.Backoff(r.kafkaStreak, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
				return armed
			}
			continue
		}
		n := res.claimed
		switch {
		case armed && (n == 0 || n < r.cfg.BatchSize && len(wake) == 0):
			return true
		case armed:
			// More commits arrived during the batch: claim them next, and
			// take the pending notification, which would only claim again.
			select {
			case <-wake:
			default:
			}
		case n == 0:
			armFirst = true
			continue
		}
		if n < r.cfg.BatchSize && r.lingers() && !sleep(ctx, r.cfg.Linger) {
			// Busy, but not behind: the sleep lets the next batch gather.
			return armed
		}
	}
	return armed
}

// noteKafka follows Kafka's health from a batch's outcome and reports
// whether the relay should back off: Kafka refused every row it was given
// because of the broker, which is what an outage looks like.
func (r *Relay) noteKafka(ctx context.Context, res batchResult) bool {
	switch {
	case res.brokerErr != nil && res.published == 0 && res.judged == 0:
		r.kafkaStreak++
		r.cfg.Metrics.kafkaConnected.Set(0)
		r.kafka.fail(ctx, res.brokerErr)
		return true
	case res.published > 0 || res.judged > 0:
		r.kafkaStreak = 0
		r.cfg.Metrics.kafkaConnected.Set(1)
		r.kafka.ok(ctx)
	}
	return false
}

// sleep waits d or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// wakeFenceKey is the advisory lock (class advisoryLockClass) that orders
// arming against writers checking whether to notify; migration 0004 takes it
// shared in the insert trigger.
const wakeFenceKey = -1

// arm marks this relay as waiting, so writers notify on commit. Taking the
// fence exclusively waits for every writer that checked the flag before it
// was set: their rows are committed before the claim that follows arming.
// It runs in a transaction of its own, committed in the claim's round trip
// before the claim's transaction begins: held through the claim, the fence
// would make writers' commits wait for the Kafka publish.
const arm = `
WITH fence AS (SELECT pg_advisory_xact_lock($2::int, $3::int))
UPDATE outbox_relays SET waiting = true FROM fence WHERE id = $1`

// disarm runs in the claim transaction, so it costs no round trip of its own.
const disarm = `UPDATE outbox_relays SET waiting = false WHERE id = $1 AND waiting`

// wakeOps are the changes to the relay's wake-up that ride along with a
// batch's round trips.
type wakeOps struct {
	// arm arms before the claim.
	arm bool
	// disarmIfBusy disarms when the batch commits if the claim filled the
	// batch (a backlog) or the relay's rate is above busyRate.
	disarmIfBusy bool
}

// heartbeatLoop heartbeats and rebalances every RebalanceInterval until ctx
// ends, and wakes the claim loop when it took partitions or re-created the
// registration.
func (r *Relay) heartbeatLoop(ctx context.Context, wake chan<- struct{}) {
	tick := time.NewTicker(r.cfg.RebalanceInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		before := len(r.owner.partitions())
		r.rebalance(ctx)
		// New partitions may hold rows nothing will notify about, and a new
		// registration must be armed before writers notify again.
		if len(r.owner.partitions()) > before || r.owner.reregistered.Load() {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}
}

func (r *Relay) rebalance(ctx context.Context) {
	// Bounded: past the TTL the registration is gone anyway, and a hung
	// query must not stop the heartbeats that follow.
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RelayTTL)
	defer cancel()
	err := r.owner.rebalance(ctx, r.cfg.Metrics.roundTrips.WithLabelValues("heartbeat"))
	switch {
	case err == nil:
		r.heartbeat.ok(ctx)
	case ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded):
		r.cfg.Metrics.dbErrors.WithLabelValues("heartbeat").Inc()
		r.heartbeat.fail(ctx, err)
	}
	r.cfg.Metrics.ownedPartitions.Set(float64(len(r.owner.partitions())))
}

// listen forwards commit notifications to wake, reconnecting with backoff on
// failure; the poll covers the time without.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for streak := 1; ctx.Err() == nil; streak++ {
		err := r.listenOnce(ctx, wake, func() { streak = 0; r.listening.ok(ctx) })
		if ctx.Err() != nil {
			return
		}
		r.cfg.Metrics.dbErrors.WithLabelValues("listen").Inc()
		r.listening.fail(ctx, err)
		if !sleep(ctx, retry.Backoff(max(streak, 1), r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
			return
		}
	}
}

// listenOnce listens on one connection until it fails; listening is called
// once LISTEN took effect.
func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}, listening func()) error {
	pooled, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Take the connection out of the pool: its LISTEN must not leak to other users.
	conn := pooled.Hijack()
	defer conn.Close(context.Background())
	r.cfg.Metrics.roundTrips.WithLabelValues("listen").Inc()
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	listening()
	// Rows committed while nobody listened notified no one.
	select {
	case wake <- struct{}{}:
	default:
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		select {
		case wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// fenceLockClass namespaces the per-partition claim fences (two-key form:
// class, partition); see fencePartitions.
const fenceLockClass = 0x6f627832 // "obx2"

// fencePartitions takes, for the claim transaction, an exclusive lock per
// owned partition, in partition order (so two claims cannot deadlock).
//
// This, not the ownership lock, is what keeps a partition's events in order
// when it changes hands. The ownership lock is held on another connection
// and changes on the heartbeat goroutine, whenever the share changes, so a
// partition may be released, or lost with the lock connection, while a
// batch of it is in flight. FOR UPDATE alone would make the new owner wait
// for the in-flight rows, but not for the rest: its claim's snapshot was
// taken before the old batch committed, so it would not see that a row of
// that batch failed and now holds its aggregate back, and could publish the
// aggregate's next event first. The fence makes every claim of a partition
// wait for the previous claim transaction of that partition to end before
// it reads anything, so each claim sees everything the previous one wrote,
// whoever owns the partition, and even while two relays both believe they do.
//
// It is a statement of its own, after the settings and before the claim:
// in READ COMMITTED a statement reads from a snapshot taken when it starts,
// so a claim that took the fence itself would read from before the wait,
// which is the very overtaking the fence is there to stop. The pipeline
// makes the three statements one round trip anyway (relayBatch).
const fencePartitions = `SELECT count(pg_advisory_xact_lock($1, p)) FROM unnest($2::int[]) AS p`

// claimSettings are the claim transaction's: a bounded wait for locks (a
// handover), and a commit that need not wait for the disk, because a mark
// lost in a crash only republishes the batch, which consumers absorb
// (BENCHMARKS.md).
const claimSettings = `SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'off', true)`

// undeferOutage makes the rows an outage deferred due again once their topic
// takes writes again, rather than each waiting out its own deferral. Only
// an outage defers a row without charging an attempt, so attempts = 0 with
// a future next_attempt_at identifies them (a requeue resets
// next_attempt_at). Scoped to the aggregate types of the topic that
// recovered: a topic that is still missing keeps its rows deferred.
const undeferOutage = `
UPDATE outbox_events SET next_attempt_at = '-infinity'
WHERE state = 'pending' AND attempts = 0 AND next_attempt_at > '-infinity' AND next_attempt_at > now()
  AND partition = ANY($1) AND aggregate_type = ANY($2)`

// claimBatch takes the next due rows of the owned partitions in id order.
// A row waits while an earlier row of its aggregate is dead or backing off,
// so a retry never lets a later event overtake. FOR UPDATE without SKIP
// LOCKED: rows someone else holds (an operator's requeue, say) are waited
// for, not skipped, so they cannot be overtaken either.
const claimBatch = `
SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version,
       o.event_type, o.event_version, o.payload, o.headers, o.occurred_at, o.created_at, o.attempts
FROM outbox_events o
WHERE o.state = 'pending' AND o.next_attempt_at <= now() AND o.partition = ANY($2)
  AND NOT EXISTS (
      SELECT 1 FROM outbox_events e
      WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id
        AND (e.state = 'dead' OR (e.state = 'pending' AND e.next_attempt_at > '-infinity'))
        AND (e.state = 'dead' OR e.next_attempt_at > now()))
ORDER BY o.id
LIMIT $1
FOR UPDATE OF o`

const markPublished = `
UPDATE outbox_events
SET state = 'published', published_at = now(), attempts = attempts + 1, last_error = NULL
WHERE id = ANY($1)`

const markFailed = `
UPDATE outbox_events
SET attempts = attempts + 1,
    last_error = $2,
    next_attempt_at = now() + $3 * interval '1 microsecond',
    state = CASE WHEN attempts + 1 >= $4 THEN 'dead' ELSE 'pending' END
WHERE id = $1
RETURNING state`

// markDeferred puts off rows the broker could not take, without charging
// an attempt: the deferral lets the relay move past a topic or partition
// that is unavailable, and holds back the rows' aggregates meanwhile.
const markDeferred = `
UPDATE outbox_events o
SET last_error = d.last_error, next_attempt_at = now() + d.delay_us * interval '1 microsecond'
FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS d(id, last_error, delay_us)
WHERE o.id = d.id`

type claimed struct {
	id        int64
	attempts  int
	createdAt time.Time
	aggType   string
	aggregate string // type + id
	msg       kafka.Message
	// undecodable is why the row could not be made into a message; such a
	// row is a message error, charged an attempt and never published.
	undecodable error
}

// batchResult is what one batch did.
type batchResult struct {
	claimed   int
	published int
	judged    int   // rows refused because of the message (by the broker, or undecodable)
	brokerErr error // the first error about the broker; nil if none
	// armed and disarmed say that the batch's round trips changed the
	// relay's wake-up (wakeOps).
	armed, disarmed bool
}

// relayOneBatch claims, publishes and marks one batch of the owned
// partitions, returning how many rows it claimed. Run works in the same
// steps; this package's tests and benchmarks drive the relay through it one
// batch at a time (export_test.go). Called outside Run it first takes this
// relay's share of the partitions. It must not be called concurrently with
// Run.
// Rows Kafka could not take because of the broker stay pending, deferred
// for the relay's outage backoff without an attempt charged; they count as
// claimed.
func (r *Relay) relayOneBatch(ctx context.Context) (int, error) {
	if r.owner.conn == nil {
		r.rebalance(ctx)
	}
	res, err := r.relayBatch(ctx, wakeOps{})
	if err == nil {
		r.noteKafka(ctx, res)
	}
	return res.claimed, err
}

// relayBatch claims, publishes and marks one batch in two round trips to
// Postgres, each a pipeline of statements (pgx.Batch): the first begins the
// transaction, sets it up, takes the partition fences and claims (arming
// first, in a transaction of its own, when ops.arm); the second records the
// outcome of every row and commits (disarming on the way, per ops). A claim
// that finds nothing costs the same two.
func (r *Relay) relayBatch(ctx context.Context, ops wakeOps) (res batchResult, err error) {
	owned := r.owner.partitions()
	if len(owned) == 0 {
		return batchResult{}, nil
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return batchResult{}, fmt.Errorf("acquiring a connection to claim: %w", err)
	}
	inTx := false
	defer func() {
		if inTx {
			// A failed statement or a crash point left the transaction
			// open: end it, so that the connection goes back to the pool
			// clean (the pool would destroy it otherwise).
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r.cfg.Metrics.roundTrips.WithLabelValues("rollback").Inc()
			_, _ = conn.Exec(rctx, "rollback")
			cancel()
		}
		conn.Release()
	}()

	undefer := r.undefer
	claim := &pgx.Batch{}
	if ops.arm {
		claim.Queue("begin")
		claim.Queue(arm, r.cfg.ID, advisoryLockClass, wakeFenceKey)
		claim.Queue("commit")
	}
	// owned is sorted (owner.set), so concurrent fences take their locks in
	// one order and cannot deadlock.
	claim.Queue("begin")
	claim.Queue(claimSettings, strconv.FormatInt(r.cfg.LockTimeout.Milliseconds(), 10))
	claim.Queue(fencePartitions, fenceLockClass, owned)
	if len(undefer) > 0 {
		claim.Queue(undeferOutage, owned, undefer)
	}
	claim.Queue(claimBatch, r.cfg.BatchSize, owned)
	r.cfg.Metrics.roundTrips.WithLabelValues("claim").Inc()
	r.cfg.Metrics.claims.Inc()
	inTx = true
	batch, armed, err := r.readClaim(claim, conn.SendBatch(ctx, claim), ops.arm)
	res.armed = armed
	if err != nil {
		return res, err
	}
	rate := r.noteRate(len(batch), time.Now())
	if len(batch) == 0 {
		r.cfg.Metrics.emptyClaims.Inc()
		r.cfg.Metrics.roundTrips.WithLabelValues("commit").Inc()
		inTx = false
		if _, err := conn.Exec(ctx, "commit"); err != nil {
			return res, fmt.Errorf("ending an empty claim: %w", err)
		}
		if len(undefer) > 0 {
			r.undefer = nil
		}
		return res, nil
	}
	r.cfg.Metrics.batchSize.Observe(float64(len(batch)))

	// Publish only what can be published in order: an undecodable row, and
	// the later rows of its aggregate, stay behind it.
	held := map[string]bool{} // aggregates with an earlier row of this batch not published
	var publish []claimed
	for _, c := range batch {
		switch {
		case c.undecodable != nil:
			held[c.aggregate] = true
		case !held[c.aggregate]:
			publish = append(publish, c)
		}
	}
	endSends := startSends(ctx, publish)
	publishCtx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	errs := publishBatch(publishCtx, r.writer, publish)
	cancel()
	endSends(errs)
	if ctx.Err() != nil {
		return res, ctx.Err() // leave the rows pending; the next run republishes them
	}
	if r.cfg.CrashPoint != nil {
		if err := r.cfg.CrashPoint(CrashAfterAck); err != nil {
			return res, fmt.Errorf("crash point %s: %w", CrashAfterAck, err)
		}
	}
	cause := make(map[int64]error, len(publish))
	for i, c := range publish {
		cause[c.id] = errs[i]
	}

	res.claimed = len(batch)
	var (
		published             []int64
		failed                []claimed
		failedCauses          []error
		deferIDs, deferDelays []int64
		deferErrs             []string
		brokerTopics          = map[string]bool{}
		okTopics              = map[string]bool{}
	)
	clear(held)
	now := time.Now()
	for _, c := range batch {
		err, sent := cause[c.id]
		if c.undecodable != nil {
			err = c.undecodable
		}
		if sent && err != nil && !kafkaerr.IsMessageError(err) && !errors.Is(err, errHeldBack) {
			r.cfg.Metrics.kafkaErrors.Inc()
		}
		switch {
		case held[c.aggregate] || errors.Is(err, errHeldBack):
			// An earlier event of this aggregate failed: leave this one
			// pending and untouched, so that it is retried after that event
			// and keeps order. writeTopic did not give it to the broker; the
			// failed row now holds the aggregate back (claimBatch).
		case err == nil:
			published = append(published, c.id)
			okTopics[c.msg.Topic] = true
			r.cfg.Metrics.publishLag.Observe(now.Sub(c.createdAt).Seconds())
			if c.attempts > 0 {
				r.cfg.Metrics.retries.Inc()
			}
		case c.undecodable != nil || kafkaerr.IsMessageError(err):
			held[c.aggregate] = true
			res.judged++
			if c.undecodable == nil {
				okTopics[c.msg.Topic] = true
			}
			failed, failedCauses = append(failed, c), append(failedCauses, err)
		default:
			held[c.aggregate] = true
			brokerTopics[c.msg.Topic] = true
			if res.brokerErr == nil {
				res.brokerErr = err
			}
			// Deferred by how long this topic has been failing, so a topic
			// that stays unavailable is retried ever less often while the
			// other topics flow.
			delay := retry.Backoff(r.topicStreak[c.msg.Topic]+1, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)
			deferIDs, deferErrs, deferDelays = append(deferIDs, c.id), append(deferErrs, err.Error()), append(deferDelays, delay.Microseconds())
			if r.deferredTypes[c.msg.Topic] == nil {
				r.deferredTypes[c.msg.Topic] = map[string]bool{}
			}
			r.deferredTypes[c.msg.Topic][c.aggType] = true
		}
	}

	finish := &pgx.Batch{}
	delays := make([]time.Duration, len(failed))
	for i, c := range failed {
		r.cfg.Metrics.failures.Inc()
		delays[i] = retry.Backoff(c.attempts+1, r.cfg.BackoffMin, r.cfg.BackoffMax)
		finish.Queue(markFailed, c.id, failedCauses[i].Error(), delays[i].Microseconds(), r.cfg.MaxAttempts)
	}
	if len(published) > 0 {
		finish.Queue(markPublished, published)
	}
	if len(deferIDs) > 0 {
		finish.Queue(markDeferred, deferIDs, deferErrs, deferDelays)
	}
	disarming := ops.disarmIfBusy && (len(batch) >= r.cfg.BatchSize || rate > busyRate)
	if disarming {
		finish.Queue(disarm, r.cfg.ID)
	}
	finish.Queue("commit")
	r.cfg.Metrics.roundTrips.WithLabelValues("commit").Inc()
	states, err := readFinish(conn.SendBatch(ctx, finish), len(failed))
	if err != nil {
		return res, err
	}
	inTx = false
	res.disarmed = disarming
	for i, c := range failed {
		r.logFailed(ctx, c, failedCauses[i], delays[i], states[i])
	}
	if len(undefer) > 0 {
		r.undefer = nil
	}
	for topic := range brokerTopics {
		r.topicStreak[topic]++
	}
	for topic := range okTopics {
		if brokerTopics[topic] {
			continue
		}
		// The topic works again: what its outage deferred may go now.
		delete(r.topicStreak, topic)
		for t := range r.deferredTypes[topic] {
			if !slices.Contains(r.undefer, t) {
				r.undefer = append(r.undefer, t)
			}
		}
		delete(r.deferredTypes, topic)
	}
	res.published = len(published)
	r.cfg.Metrics.published.Add(float64(len(published)))
	return res, nil
}

// readClaim reads the results of the claim's pipeline, in the order
// relayBatch queued them, and reports whether arming took.
func (r *Relay) readClaim(b *pgx.Batch, br pgx.BatchResults, arming bool) (batch []claimed, armed bool, err error) {
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("claiming batch: %w", cerr)
		}
	}()
	n := len(b.QueuedQueries)
	for i := 0; i < n-1; i++ {
		tag, err := br.Exec()
		if err != nil {
			return nil, armed, fmt.Errorf("setting up the claim (%s): %w", firstWord(b.QueuedQueries[i].SQL), err)
		}
		if arming && i == 1 {
			armed = tag.RowsAffected() == 1
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, armed, fmt.Errorf("claiming batch: %w", err)
	}
	batch, err = pgx.CollectRows(rows, r.scanClaimed)
	if err != nil {
		return nil, armed, fmt.Errorf("reading claimed rows: %w", err)
	}
	return batch, armed, nil
}

// firstWord names a statement in an error without quoting all of it.
func firstWord(sql string) string {
	sql = strings.TrimSpace(sql)
	if i := strings.IndexAny(sql, " \n"); i > 0 {
		return sql[:i]
	}
	return sql
}

// readFinish reads the results of the finishing pipeline: the state each
// failed row was left in, then the marks and the commit.
func readFinish(br pgx.BatchResults, failed int) (states []string, err error) {
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("committing batch: %w", cerr)
		}
	}()
	states = make([]string, failed)
	for i := range states {
		if err := br.QueryRow().Scan(&states[i]); err != nil {
			return nil, fmt.Errorf("recording failed publish: %w", err)
		}
	}
	return states, nil
}

// publishBatch writes the batch to w and returns one error per row (nil: acked).
// Each topic is written separately and concurrently: kafka-go fails a whole
// write when one of its topics is unknown, and one misrouted aggregate type
// must not hold up the others. An aggregate's events all go to one topic,
// so writeTopic alone keeps them in order.
func publishBatch(ctx context.Context, w Writer, batch []claimed) []error {
	byTopic := map[string][]int{}
	for i, c := range batch {
		byTopic[c.msg.Topic] = append(byTopic[c.msg.Topic], i)
	}
	limits := writerLimits(w)
	errs := make([]error, len(batch))
	var wg sync.WaitGroup
	for _, idx := range byTopic {
		wg.Go(func() {
			msgs := make([]kafka.Message, len(idx))
			aggs := make([]string, len(idx))
			for j, i := range idx {
				msgs[j], aggs[j] = batch[i].msg, batch[i].aggregate
			}
			for j, err := range writeTopic(ctx, w, limits, msgs, aggs) {
				errs[idx[j]] = err
			}
		})
	}
	wg.Wait()
	return errs
}

// errHeldBack is the outcome of a message that was not written because an
// earlier message of its aggregate in the same batch failed: the broker must
// not have an aggregate's event while it lacks an earlier one.
var errHeldBack = errors.New("outbox: not written: an earlier event of its aggregate in the batch failed")

// batchLimits are how many messages, and how many bytes of them, kafka-go's
// writer puts into one record batch of a partition (Writer.BatchSize and
// BatchBytes). Zero: unknown.
type batchLimits struct {
	count int
	bytes int64
}

// writerLimits reads w's batch limits when w is kafka-go's writer (as
// a wrapper's KafkaWriter() returns); another Writer gets the zero limits, and the
// relay gives it each topic's messages in one call, as it is.
func writerLimits(w Writer) batchLimits {
	var kw *kafka.Writer
	switch w := w.(type) {
	case *kafka.Writer:
		kw = w
	case interface{ KafkaWriter() *kafka.Writer }:
		// A wrapper that owns more than the writer (platform/kafkautil's
		// closes its transport too) hands over the writer it wraps.
		kw = w.KafkaWriter()
	}
	if kw == nil {
		return batchLimits{}
	}
	// kafka-go's own defaults for zero fields.
	l := batchLimits{count: kw.BatchSize, bytes: kw.BatchBytes}
	if l.count <= 0 {
		l.count = 100
	}
	if l.bytes <= 0 {
		l.bytes = 1 << 20
	}
	return l
}

// messageBytes is at least what kafka-go counts for m against BatchBytes
// (its Message.totalSize: the lengths plus fixed fields and varints, which
// 64 bytes and 20 per header more than cover). Overcounting only splits a
// write earlier than needed; undercounting could let kafka-go split one
// partition's messages into two record batches (see writeTopic).
func messageBytes(m kafka.Message) int64 {
	n := int64(64 + len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(20 + len(h.Key) + len(h.Value))
	}
	return n
}

// writeTopic writes msgs, in order, to one topic and returns one error per
// message; aggs[i] names msgs[i]'s aggregate. Two rules shape it.
//
// An aggregate's later messages are never written once one of its messages
// failed: they get errHeldBack and stay behind it (relayBatch leaves them
// pending). The broker judges a partition's record batch as a whole, but
// kafka-go cuts one call's messages for a partition into several record
// batches when they exceed its BatchSize or BatchBytes and sends them one
// after the other, so in one call the broker could refuse v1 and then take
// v2. writeTopic therefore cuts msgs into calls that each fit one record
// batch per partition (limits), and holds an aggregate back in the calls
// after the one where it failed. Within a call, an aggregate's messages
// share one partition and one record batch, and so their fate.
//
// A message error lands on the message it is about, not on its batch-mates,
// which would otherwise be charged an attempt for it (writeCall).
func writeTopic(ctx context.Context, w Writer, limits batchLimits, msgs []kafka.Message, aggs []string) []error {
	errs := make([]error, len(msgs))
	failed := map[string]bool{}
	for _, a := range aggs {
		failed[a] = false
	}
	if len(failed) == len(msgs) {
		// No aggregate has two events here, so no split can reorder one:
		// one call, however kafka-go cuts it, is the fastest.
		limits = batchLimits{}
	}
	for start := 0; start < len(msgs); {
		end, bytes := start, int64(0)
		for end < len(msgs) {
			n := messageBytes(msgs[end])
			if end > start && limits.count > 0 && (end-start >= limits.count || bytes+n > limits.bytes) {
				break
			}
			bytes += n
			end++
		}
		var todo []int // indexes into msgs to write in this call
		for i := start; i < end; i++ {
			if failed[aggs[i]] {
				errs[i] = errHeldBack
				continue
			}
			todo = append(todo, i)
		}
		writeCall(ctx, w, msgs, aggs, todo, errs)
		for _, i := range todo {
			if errs[i] != nil {
				failed[aggs[i]] = true
			}
		}
		start = end
	}
	return errs
}

// writeCall writes msgs[todo] in one call and records each one's outcome in
// errs:
//   - kafka-go refuses the whole write, before sending anything, when one
//     message is larger than its BatchBytes (kafka.MessageTooLargeError,
//     naming the message): that message gets the error, the later messages
//     of its aggregate are held back, and the rest are written again;
//   - the broker judges a whole record batch at once, so a message error
//     it returns for several messages is checked by writing each of them
//     on its own, in order, holding back an aggregate's later messages
//     once one of its messages fails.
func writeCall(ctx context.Context, w Writer, msgs []kafka.Message, aggs []string, todo []int, errs []error) {
	for len(todo) > 0 {
		batch := make([]kafka.Message, len(todo))
		for j, i := range todo {
			batch[j] = msgs[i]
		}
		err := w.WriteMessages(ctx, batch...)
		var tooLarge kafka.MessageTooLargeError
		if errors.As(err, &tooLarge) {
			if j := slices.IndexFunc(batch, func(m kafka.Message) bool { return sameMessage(m, tooLarge.Message) }); j >= 0 {
				refused := todo[j]
				errs[refused] = err
				rest := todo[:j:j]
				for _, i := range todo[j+1:] {
					if aggs[i] == aggs[refused] {
						errs[i] = errHeldBack
						continue
					}
					rest = append(rest, i)
				}
				todo = rest
				continue
			}
		}
		judged := map[int]bool{}
		for j, e := range perMessage(err, len(todo)) {
			errs[todo[j]] = e
			if kafkaerr.IsMessageError(e) {
				judged[todo[j]] = true
			}
		}
		if len(judged) > 1 {
			bad := map[string]bool{}
			for _, i := range todo {
				switch {
				case errs[i] == nil:
					// Written by the call above.
				case bad[aggs[i]]:
					errs[i] = errHeldBack
				case judged[i]:
					errs[i] = perMessage(w.WriteMessages(ctx, msgs[i]), 1)[0]
				}
				if errs[i] != nil {
					bad[aggs[i]] = true
				}
			}
		}
		return
	}
}

// sameMessage tells a message by its key, value and headers; the headers
// carry the event id, so two events never compare equal.
func sameMessage(a, b kafka.Message) bool {
	return bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value) &&
		slices.EqualFunc(a.Headers, b.Headers, func(x, y kafka.Header) bool {
			return x.Key == y.Key && bytes.Equal(x.Value, y.Value)
		})
}

// perMessage spreads a write error over the messages: kafka-go reports
// either one error per message (kafka.WriteErrors) or one for the write.
func perMessage(err error, n int) []error {
	errs := make([]error, n)
	if err == nil {
		return errs
	}
	var we kafka.WriteErrors
	if errors.As(err, &we) && len(we) == n {
		return we
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// scanClaimed reads one claimed row. A row whose headers cannot be decoded
// is returned with undecodable set rather than failing the claim: the claim
// would fail the same way on every try, and nothing else would ever move.
func (r *Relay) scanClaimed(row pgx.CollectableRow) (claimed, error) {
	var (
		c       claimed
		ev      event.Envelope
		headers []byte
	)
	// *[16]byte, not *uuid.UUID: pgx decodes it natively instead of
	// through sql.Scanner and text, a tenth of the claim's CPU.
	err := row.Scan(&c.id, (*[16]byte)(&ev.EventID), &ev.AggregateType, &ev.AggregateID, &ev.AggregateVersion,
		&ev.EventType, &ev.EventVersion, &ev.Payload, &headers, &ev.OccurredAt, &c.createdAt, &c.attempts)
	if err != nil {
		return c, err
	}
	c.aggType = ev.AggregateType
	c.aggregate = ev.AggregateType + "\x00" + ev.AggregateID
	var h envelopeHeaders
	if err := json.Unmarshal(headers, &h); err != nil {
		c.msg.Topic = r.cfg.Topic(ev.AggregateType)
		c.undecodable = fmt.Errorf("%w: event %s: decoding the headers column: %w", ErrUndecodable, ev.EventID, err)
		return c, nil
	}
	ev.CorrelationID, ev.CausationID, ev.Traceparent = h.CorrelationID, h.CausationID, h.Traceparent
	c.msg = event.ToKafka(r.cfg.Topic(ev.AggregateType), ev)
	return c, nil
}

// logFailed logs a row whose publish failed because of the message, now
// that its new state is committed.
func (r *Relay) logFailed(ctx context.Context, c claimed, cause error, delay time.Duration, state string) {
	log := r.cfg.Logger.With(slog.Int64("outbox_id", c.id), slog.String("topic", c.msg.Topic),
		slog.Int("attempt", c.attempts+1), slog.Any("error", cause))
	if state == "dead" {
		r.cfg.Metrics.deadTotal.Inc()
		log.ErrorContext(ctx, "outbox event is dead after its last attempt; its aggregate's later events wait until it is requeued")
		return
	}
	log.WarnContext(ctx, "outbox publish failed because of the message; will retry", slog.Duration("retry_in", delay))
}
