package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/event/retry"
	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
)

// Writer is the part of *kafka.Writer the relay needs. It must return only
// after the broker acknowledged (RequiredAcks = RequireAll).
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
	kafka, claims, heartbeat, gauges, listening, waking *outage

	// Used only by the claim loop (or relayOneBatch's caller): how many batches
	// in a row Kafka refused as a whole; how many writes to each topic in a
	// row failed because of the broker; the aggregate types whose rows were
	// deferred, by topic; and the aggregate types whose deferred rows are to
	// be made due again because their topic works again.
	kafkaStreak   int
	topicStreak   map[string]int
	deferredTypes map[string]map[string]bool
	undefer       []string
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
		waking:        health("arming the commit wake-up (polling meanwhile)"),
		topicStreak:   map[string]int{},
		deferredTypes: map[string]map[string]bool{},
	}, nil
}

// Run relays until ctx ends, and returns nil then; an unreachable Kafka or
// Postgres is waited out, never returned. Its work runs on four goroutines,
// in the manner of River's producer, so that a busy claim loop never starves
// the rest:
//   - the claim loop (this goroutine) claims batch after batch while there
//     is work; when a claim finds nothing it arms a wake-up (see arm) and
//     sleeps until a transaction that wrote outbox rows commits
//     (LISTEN/NOTIFY) or, as a fallback, PollInterval passes;
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
	wg.Go(func() { r.cfg.Metrics.watchBacklog(ctx, r.pool, r.cfg.RebalanceInterval, r.gauges) })

	poll := time.NewTimer(0)
	defer poll.Stop()
	armed := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-poll.C:
			// Re-arm on every poll: a registration that expired and was
			// re-created by the heartbeat starts unarmed.
			armed = false
		}
		armed = r.drain(ctx, armed)
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

// drain relays batches until a claim finds nothing while the relay is armed,
// and reports whether it is armed. A busy relay disarms, so writers stop
// notifying while it would claim their rows anyway.
//
// Outages are waited out here, with the relay's backoff: a batch that
// Postgres failed, or one whose every row Kafka refused because of the
// broker, makes the whole relay pause before the next claim. The rows of
// such a batch stay pending without an attempt charged (see relayBatch).
func (r *Relay) drain(ctx context.Context, armed bool) bool {
	dbStreak := 0
	for ctx.Err() == nil {
		res, err := r.relayBatch(ctx)
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
		if r.noteKafka(ctx, res) {
			if !sleep(ctx, retry.Backoff(r.kafkaStreak, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
				return armed
			}
			continue
		}
		switch n := res.claimed; {
		case n > 0 && armed:
			armed = !r.setWaiting(ctx, false)
		case n == 0 && armed:
			return true
		case n == 0:
			// Arm, then claim once more: rows committed before the fence
			// would not have notified.
			if armed = r.setWaiting(ctx, true); !armed {
				return false
			}
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
const arm = `
WITH fence AS (SELECT pg_advisory_xact_lock($2::int, $3::int))
UPDATE outbox_relays SET waiting = true FROM fence WHERE id = $1`

const disarm = `UPDATE outbox_relays SET waiting = false WHERE id = $1 AND waiting`

// setWaiting arms (true) or disarms (false) commit notifications for this
// relay and reports whether it changed the flag. A relay that is not
// registered cannot arm; it relies on the poll until its next heartbeat.
func (r *Relay) setWaiting(ctx context.Context, waiting bool) bool {
	var (
		tag pgconn.CommandTag
		err error
	)
	if waiting {
		tag, err = r.pool.Exec(ctx, arm, r.cfg.ID, advisoryLockClass, wakeFenceKey)
	} else {
		tag, err = r.pool.Exec(ctx, disarm, r.cfg.ID)
	}
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.Metrics.dbErrors.WithLabelValues("claim").Inc()
			r.waking.fail(ctx, err)
		}
		return false
	}
	r.waking.ok(ctx)
	return tag.RowsAffected() == 1
}

// heartbeatLoop heartbeats and rebalances every RebalanceInterval until ctx
// ends, and wakes the claim loop when it took partitions, which may hold
// rows that nothing would notify about.
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
		if len(r.owner.partitions()) > before {
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
	err := r.owner.rebalance(ctx)
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
// It is sent with the transaction's settings in one simple-protocol round
// trip, so the partitions are spelled into the text; they are integers this
// relay computed, never input.
func fencePartitions(owned []int32) string {
	ps := make([]string, len(owned))
	for i, p := range owned {
		ps[i] = strconv.Itoa(int(p))
	}
	return fmt.Sprintf(`SELECT count(pg_advisory_xact_lock(%d, p)) FROM unnest('{%s}'::int[]) AS p`,
		fenceLockClass, strings.Join(ps, ","))
}

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
}

// batchResult is what one batch did.
type batchResult struct {
	claimed   int
	published int
	judged    int   // rows the broker refused because of the message
	brokerErr error // the first error about the broker; nil if none
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
	res, err := r.relayBatch(ctx)
	if err == nil {
		r.noteKafka(ctx, res)
	}
	return res.claimed, err
}

func (r *Relay) relayBatch(ctx context.Context) (batchResult, error) {
	owned := r.owner.partitions()
	if len(owned) == 0 {
		return batchResult{}, nil
	}
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return batchResult{}, fmt.Errorf("beginning claim: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	// The relay's own commit need not wait for the disk: a mark lost in a
	// crash only republishes the batch, which consumers absorb (BENCHMARKS.md).
	// owned is sorted (owner.set), so concurrent fences take their locks in
	// one order and cannot deadlock.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d; SET LOCAL synchronous_commit = off; %s",
		r.cfg.LockTimeout.Milliseconds(), fencePartitions(owned))); err != nil {
		return batchResult{}, fmt.Errorf("setting up the claim (lock timeout, partition fences): %w", err)
	}
	undefer := r.undefer
	if len(undefer) > 0 {
		if _, err := tx.Exec(ctx, undeferOutage, owned, undefer); err != nil {
			return batchResult{}, fmt.Errorf("resuming rows an outage deferred: %w", err)
		}
	}
	batch, err := r.claim(ctx, tx, owned)
	if err != nil || len(batch) == 0 {
		if err == nil && len(undefer) > 0 {
			if err = tx.Commit(ctx); err == nil {
				r.undefer = nil
			}
		}
		return batchResult{}, err
	}
	r.cfg.Metrics.batchSize.Observe(float64(len(batch)))
	endSends := startSends(ctx, batch)
	publishCtx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	errs := publishBatch(publishCtx, r.writer, batch)
	cancel()
	endSends(errs)
	if ctx.Err() != nil {
		return batchResult{}, ctx.Err() // leave the rows pending; the next run republishes them
	}
	if r.cfg.CrashPoint != nil {
		if err := r.cfg.CrashPoint(CrashAfterAck); err != nil {
			return batchResult{}, fmt.Errorf("crash point %s: %w", CrashAfterAck, err)
		}
	}
	res := batchResult{claimed: len(batch)}
	var (
		published             []int64
		deferIDs, deferDelays []int64
		deferErrs             []string
		brokerTopics          = map[string]bool{}
		okTopics              = map[string]bool{}
	)
	held := map[string]bool{} // aggregates with an earlier row of this batch not published
	now := time.Now()
	for i, c := range batch {
		cause := errs[i]
		if cause != nil && !kafkautil.IsMessageError(cause) {
			r.cfg.Metrics.kafkaErrors.Inc()
		}
		switch {
		case held[c.aggregate]:
			// An earlier event of this aggregate failed: leave this one
			// pending and untouched, even though the broker may have taken
			// it, so that it is retried after that event and keeps order.
			// The failed row now holds the aggregate back (claimBatch), and
			// consumers absorb the duplicate.
		case cause == nil:
			published = append(published, c.id)
			okTopics[c.msg.Topic] = true
			r.cfg.Metrics.publishLag.Observe(now.Sub(c.createdAt).Seconds())
			if c.attempts > 0 {
				r.cfg.Metrics.retries.Inc()
			}
		case kafkautil.IsMessageError(cause):
			held[c.aggregate] = true
			res.judged++
			okTopics[c.msg.Topic] = true
			if err := r.fail(ctx, tx, c, cause); err != nil {
				return batchResult{}, err
			}
		default:
			held[c.aggregate] = true
			brokerTopics[c.msg.Topic] = true
			if res.brokerErr == nil {
				res.brokerErr = cause
			}
			// Deferred by how long this topic has been failing, so a topic
			// that stays unavailable is retried ever less often while the
			// other topics flow.
			delay := retry.Backoff(r.topicStreak[c.msg.Topic]+1, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)
			deferIDs, deferErrs, deferDelays = append(deferIDs, c.id), append(deferErrs, cause.Error()), append(deferDelays, delay.Microseconds())
			if r.deferredTypes[c.msg.Topic] == nil {
				r.deferredTypes[c.msg.Topic] = map[string]bool{}
			}
			r.deferredTypes[c.msg.Topic][c.aggType] = true
		}
	}
	if len(published) > 0 {
		if _, err := tx.Exec(ctx, markPublished, published); err != nil {
			return batchResult{}, fmt.Errorf("marking published: %w", err)
		}
	}
	if len(deferIDs) > 0 {
		if _, err := tx.Exec(ctx, markDeferred, deferIDs, deferErrs, deferDelays); err != nil {
			return batchResult{}, fmt.Errorf("deferring rows the broker did not take: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return batchResult{}, fmt.Errorf("committing batch: %w", err)
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

// publishBatch writes the batch to w and returns one error per row (nil: acked).
// Each topic is written separately and concurrently: kafka-go fails a whole
// write when one of its topics is unknown, and one misrouted aggregate type
// must not hold up the others.
func publishBatch(ctx context.Context, w Writer, batch []claimed) []error {
	byTopic := map[string][]int{}
	for i, c := range batch {
		byTopic[c.msg.Topic] = append(byTopic[c.msg.Topic], i)
	}
	errs := make([]error, len(batch))
	var wg sync.WaitGroup
	for _, idx := range byTopic {
		wg.Go(func() {
			msgs := make([]kafka.Message, len(idx))
			for j, i := range idx {
				msgs[j] = batch[i].msg
			}
			for j, err := range writeTopic(ctx, w, msgs) {
				errs[idx[j]] = err
			}
		})
	}
	wg.Wait()
	return errs
}

// writeTopic writes msgs to one topic and returns one error per message, making
// sure that a message error lands on the message it is about and not on its
// batch-mates, which would otherwise be charged an attempt for it:
//   - kafka-go refuses the whole write, before sending anything, when one
//     message is larger than its BatchBytes (kafka.MessageTooLargeError,
//     naming the message): that message gets the error and the rest are
//     written again without it;
//   - the broker judges a whole produce request at once, so a message error
//     it returns for several messages is checked by writing each of them
//     on its own.
func writeTopic(ctx context.Context, w Writer, msgs []kafka.Message) []error {
	errs := make([]error, len(msgs))
	todo := make([]int, len(msgs)) // indexes into msgs still to write
	for i := range todo {
		todo[i] = i
	}
	for len(todo) > 0 {
		batch := make([]kafka.Message, len(todo))
		for j, i := range todo {
			batch[j] = msgs[i]
		}
		err := w.WriteMessages(ctx, batch...)
		var tooLarge kafka.MessageTooLargeError
		if errors.As(err, &tooLarge) {
			if j := slices.IndexFunc(batch, func(m kafka.Message) bool { return sameMessage(m, tooLarge.Message) }); j >= 0 {
				errs[todo[j]] = err
				todo = slices.Delete(todo, j, j+1)
				continue
			}
		}
		var judged []int
		for j, e := range perMessage(err, len(todo)) {
			errs[todo[j]] = e
			if kafkautil.IsMessageError(e) {
				judged = append(judged, todo[j])
			}
		}
		if len(judged) > 1 {
			for _, i := range judged {
				errs[i] = perMessage(w.WriteMessages(ctx, msgs[i]), 1)[0]
			}
		}
		break
	}
	return errs
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

func (r *Relay) claim(ctx context.Context, tx pgx.Tx, owned []int32) ([]claimed, error) {
	rows, err := tx.Query(ctx, claimBatch, r.cfg.BatchSize, owned)
	if err != nil {
		return nil, fmt.Errorf("claiming batch: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
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
		var h envelopeHeaders
		if err := json.Unmarshal(headers, &h); err != nil {
			return c, fmt.Errorf("event %s: decoding headers: %w", ev.EventID, err)
		}
		ev.CorrelationID, ev.CausationID, ev.Traceparent = h.CorrelationID, h.CausationID, h.Traceparent
		c.aggType = ev.AggregateType
		c.aggregate = ev.AggregateType + "\x00" + ev.AggregateID
		c.msg = event.ToKafka(r.cfg.Topic(ev.AggregateType), ev)
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading claimed rows: %w", err)
	}
	return batch, nil
}

func (r *Relay) fail(ctx context.Context, tx pgx.Tx, c claimed, cause error) error {
	r.cfg.Metrics.failures.Inc()
	delay := retry.Backoff(c.attempts+1, r.cfg.BackoffMin, r.cfg.BackoffMax)
	var state string
	err := tx.QueryRow(ctx, markFailed, c.id, cause.Error(), delay.Microseconds(), r.cfg.MaxAttempts).Scan(&state)
	if err != nil {
		return fmt.Errorf("recording failed publish: %w", err)
	}
	log := r.cfg.Logger.With(slog.Int64("outbox_id", c.id), slog.String("topic", c.msg.Topic),
		slog.Int("attempt", c.attempts+1), slog.Any("error", cause))
	if state == "dead" {
		r.cfg.Metrics.deadTotal.Inc()
		log.ErrorContext(ctx, "outbox event is dead after its last attempt; its aggregate's later events wait until it is requeued")
		return nil
	}
	log.WarnContext(ctx, "outbox publish failed because of the message; will retry", slog.Duration("retry_in", delay))
	return nil
}
