// The polling relay, whole: its run loop and wake-ups (LISTEN/NOTIFY,
// armed by the insert trigger), the ownership of the logical partitions,
// and a batch's claim, publish and marks. Its statements are relay_sql.go.

package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
	"github.com/onceflow/onceflow/pkg/internal/kafkaerr"
	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/internal/writercheck"
	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
	"github.com/onceflow/onceflow/pkg/outbox/internal/outage"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
	"github.com/onceflow/onceflow/pkg/outbox/internal/standby"
)

// Relay publishes pending outbox rows to Kafka and marks them published only
// after the broker acknowledged them. See the package documentation for what
// it guarantees; several relays may share one outbox.
type Relay struct {
	pool   *pgxpool.Pool
	writer Writer
	cfg    RelayConfig
	owner  *owner

	// Followed for bounded-rate logs and for health.
	kafka, claims, heartbeat, gauges, listening *outage.Outage

	// Used only by the claim loop (or relayOneBatch's caller): how many batches
	// in a row Kafka refused as a whole; how many writes to each topic in a
	// row failed because of the broker; the aggregate types whose rows were
	// deferred, by topic; and the aggregate types whose deferred rows are to
	// be made due again because their topic works again.
	kafkaStreak   int
	topicStreak   map[string]int
	deferredTypes map[string]map[string]bool
	undefer       []string
	// refused: the aggregates whose last write Kafka refused (outage_refused.go).
	refused *refused
	// The claim loop's estimate of its rate (noteRate).
	rate   float64
	rateAt time.Time
	// standby is nil unless cfg.Standby.PublishReplicated.
	standby *standby.Gate
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
	if err := writercheck.Check(w, true, "outbox: NewRelay"); err != nil {
		return nil, err
	}
	connConfig := pool.Config().ConnConfig
	health := func(what string) *outage.Outage { return outage.New(what, cfg.Logger, cfg.LogInterval) }
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
		refused:       newRefused(3 * cfg.OutageBackoffMax),
		standby:       standby.NewGate(standby.Config(cfg.Standby), cfg.Metrics.set(), cfg.Logger, cfg.LogInterval),
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
		r.cfg.Metrics.set().WatchBacklogOf(ctx, r.pool, r.cfg.RebalanceInterval, r.gauges, r.cfg.Metrics.RoundTrips.WithLabelValues("gauges"))
	})

	poll := time.NewTimer(0)
	defer poll.Stop()
	armed := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			if r.lingers() && !retry.Sleep(ctx, r.cfg.Linger) {
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

// relayHealth is what a relay knows about its dependencies. It is not meant
// for readiness: the relay rides out both outages, and the service it runs
// in can take writes meanwhile. Nothing outside this package's tests reads
// it (export_test.go); the metrics and the logs are what operators see.
type relayHealth struct {
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

// health reports the relay's view of Kafka and Postgres now. It is safe to
// call while Run runs.
func (r *Relay) health() relayHealth {
	h := relayHealth{KafkaConnected: true, PostgresConnected: true, OwnedPartitions: len(r.owner.partitions())}
	if down, since, err := r.kafka.State(); down {
		h.KafkaConnected, h.KafkaDownSince, h.LastError = false, since, err.Error()
	}
	for _, o := range []*outage.Outage{r.claims, r.heartbeat} {
		if down, since, err := o.State(); down {
			if h.PostgresConnected || since.Before(h.PostgresDownSince) {
				h.PostgresDownSince = since
			}
			h.PostgresConnected, h.LastError = false, err.Error()
		}
	}
	return h
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
			r.cfg.Metrics.DbErrors.WithLabelValues("claim").Inc()
			r.claims.Fail(ctx, err)
			if !retry.Sleep(ctx, retry.Backoff(dbStreak, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
				return armed
			}
			continue
		}
		dbStreak = 0
		r.claims.OK(ctx)
		if ops.arm && !armed {
			// Not registered (yet, or any more): the poll covers until the
			// heartbeat registers the relay again.
			return false
		}
		armFirst = false
		if r.noteKafka(ctx, res) {
			if !retry.Sleep(ctx, retry.Backoff(r.kafkaStreak, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
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
		case n == 0 && r.noteRate(0, time.Now()) > busyRate:
			// Busy a moment ago: this is a gap between commits, not the
			// end of the traffic. Arming now would make every writer wait
			// at the fence (arm) several times a second; claim again after
			// a short sleep instead, and arm once the rate has fallen.
			if !retry.Sleep(ctx, max(r.cfg.Linger, time.Millisecond)) {
				return armed
			}
			continue
		case n == 0:
			armFirst = true
			continue
		}
		if n < r.cfg.BatchSize && r.lingers() && !retry.Sleep(ctx, r.cfg.Linger) {
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
		r.cfg.Metrics.KafkaConnected.Set(0)
		r.kafka.Fail(ctx, res.brokerErr)
		return true
	case res.published > 0 || res.judged > 0:
		r.kafkaStreak = 0
		r.cfg.Metrics.KafkaConnected.Set(1)
		// Some partitions took writes; Kafka works again only once every
		// event it refused has gone out (outage_refused.go).
		if res.brokerErr != nil {
			r.kafka.Fail(ctx, res.brokerErr)
		} else if r.refused.waiting(time.Now()) {
			_, _, last := r.kafka.State()
			r.kafka.Fail(ctx, last)
		} else {
			r.kafka.OK(ctx)
		}
	}
	return false
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
	err := r.owner.rebalance(ctx, r.cfg.Metrics.RoundTrips.WithLabelValues("heartbeat"))
	switch {
	case err == nil:
		r.heartbeat.OK(ctx)
	case ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded):
		r.cfg.Metrics.DbErrors.WithLabelValues("heartbeat").Inc()
		r.heartbeat.Fail(ctx, err)
	}
	r.cfg.Metrics.OwnedPartitions.Set(float64(len(r.owner.partitions())))
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

// wakeOps are the changes to the relay's wake-up that ride along with a
// batch's round trips.
type wakeOps struct {
	// arm arms before the claim.
	arm bool
	// disarmIfBusy disarms when the batch commits if the claim filled the
	// batch (a backlog) or the relay's rate is above busyRate.
	disarmIfBusy bool
}

// listen forwards commit notifications to wake, reconnecting with backoff on
// failure; the poll covers the time without.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for streak := 1; ctx.Err() == nil; streak++ {
		err := r.listenOnce(ctx, wake, func() { streak = 0; r.listening.OK(ctx) })
		if ctx.Err() != nil {
			return
		}
		r.cfg.Metrics.DbErrors.WithLabelValues("listen").Inc()
		r.listening.Fail(ctx, err)
		if !retry.Sleep(ctx, retry.Backoff(max(streak, 1), r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
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
	r.cfg.Metrics.RoundTrips.WithLabelValues("listen").Inc()
	if _, err := conn.Exec(ctx, "LISTEN "+lifecycle.NotifyChannel); err != nil {
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

// advisoryLockClass namespaces the outbox's advisory locks (two-key form:
// class, partition) so they cannot collide with other users of advisory locks
// in the same database.
const advisoryLockClass = 0x6f627831 // "obx1"

// owner keeps this relay's share of the logical partitions.
//
// Ownership is a session-level advisory lock per partition, held on a
// dedicated connection: if the relay dies, Postgres drops the connection and
// with it the locks, and the other relays take the partitions over on their
// next rebalance. Every relay registers in outbox_relays and heartbeats; the
// fair share is ceil(partitionCount / live relays), so a relay that joins makes
// the others release partitions, and one that leaves or dies lets them take
// more.
//
// Ownership spreads the work; it is not what keeps order. Rebalancing runs
// on the relay's heartbeat goroutine, beside the claim loop, so a partition
// may be released (or lost with the lock connection) while a batch of it is
// in flight. Order is kept by the claim transaction instead: it takes a
// per-partition fence lock before reading (fencePartitions in relay_sql.go), so
// a relay that takes over waits for the previous owner's batch to commit and
// then sees everything it wrote, and it claims rows in id order skipping
// none (FOR UPDATE without SKIP LOCKED).
type owner struct {
	id     string
	dial   func(ctx context.Context) (*pgx.Conn, error)
	ttl    time.Duration
	logger *slog.Logger

	conn *pgx.Conn // used only by rebalance and leave, never concurrently (Relay.Run)

	mu    sync.Mutex
	owned []int32

	// reregistered is set when a heartbeat created the relay's row in
	// outbox_relays rather than refreshing it, and cleared by the claim
	// loop, which must then arm again: a new row is not waiting.
	reregistered atomic.Bool
}

// partitions returns a copy of the partitions this relay owns now.
func (o *owner) partitions() []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.owned)
}

func (o *owner) set(owned []int32) {
	slices.Sort(owned)
	o.mu.Lock()
	o.owned = owned
	o.mu.Unlock()
}

// rebalance heartbeats, then takes or releases partitions to hold the fair
// share; each statement it sends adds one to roundTrips.
func (o *owner) rebalance(ctx context.Context, roundTrips prometheus.Counter) error {
	if o.conn == nil || o.conn.IsClosed() {
		o.set(nil) // a lost connection took its locks with it
		conn, err := o.dial(ctx)
		if err != nil {
			return fmt.Errorf("connecting for partition locks: %w", err)
		}
		o.conn = conn
	}
	var (
		live    int
		created bool
	)
	roundTrips.Inc()
	err := o.conn.QueryRow(ctx, heartbeat, o.id, o.ttl.Microseconds()).Scan(&live, &created)
	if err == nil && created {
		o.reregistered.Store(true)
	}
	if err != nil {
		o.drop()
		return fmt.Errorf("heartbeat: %w", err)
	}
	share := (partitionCount + live - 1) / live
	owned := o.partitions()
	switch {
	case len(owned) > share:
		// Release the highest partitions; the lowest stay, so relays keep
		// stable assignments across rebalances.
		extra := owned[share:]
		roundTrips.Inc()
		if _, err := o.conn.Exec(ctx, releasePartitions, advisoryLockClass, extra); err != nil {
			o.drop()
			return fmt.Errorf("releasing partitions: %w", err)
		}
		o.set(owned[:share])
		o.logger.InfoContext(ctx, "outbox relay released partitions", slog.String("relay_id", o.id),
			slog.Int("released", len(extra)), slog.Int("owned", share), slog.Int("live_relays", live))
	case len(owned) < share:
		candidates := make([]int32, 0, partitionCount)
		for p := int32(0); p < partitionCount; p++ {
			if !slices.Contains(owned, p) {
				candidates = append(candidates, p)
			}
		}
		rand.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
		roundTrips.Inc()
		rows, err := o.conn.Query(ctx, takePartitions, advisoryLockClass, candidates, share-len(owned))
		if err != nil {
			o.drop()
			return fmt.Errorf("taking partitions: %w", err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			o.drop()
			return fmt.Errorf("taking partitions: %w", err)
		}
		if len(got) > 0 {
			o.set(append(owned, got...))
			o.logger.InfoContext(ctx, "outbox relay took partitions", slog.String("relay_id", o.id),
				slog.Int("taken", len(got)), slog.Int("owned", len(owned)+len(got)), slog.Int("live_relays", live))
		}
	}
	return nil
}

// drop closes the lock connection, releasing every partition at once.
func (o *owner) drop() {
	o.set(nil)
	if o.conn != nil {
		o.conn.Close(context.Background())
		o.conn = nil
	}
}

// leave deregisters and releases everything, so the others rebalance now
// instead of after the TTL.
func (o *owner) leave() {
	if o.conn != nil && !o.conn.IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = o.conn.Exec(ctx, deregister, o.id)
	}
	o.drop()
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
			r.cfg.Metrics.RoundTrips.WithLabelValues("rollback").Inc()
			_, _ = conn.Exec(rctx, "rollback")
			cancel()
		}
		conn.Release()
	}()

	undefer := r.undefer
	claim := &pgx.Batch{}
	if ops.arm {
		claim.Queue("begin")
		claim.Queue(armSettings)
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
	r.cfg.Metrics.RoundTrips.WithLabelValues("claim").Inc()
	r.cfg.Metrics.Claims.Inc()
	inTx = true
	batch, armed, err := r.readClaim(claim, conn.SendBatch(ctx, claim), ops.arm)
	res.armed = armed
	if err != nil {
		return res, err
	}
	rate := r.noteRate(len(batch), time.Now())
	if len(batch) == 0 {
		r.cfg.Metrics.EmptyClaims.Inc()
		r.cfg.Metrics.RoundTrips.WithLabelValues("commit").Inc()
		inTx = false
		if _, err := conn.Exec(ctx, "commit"); err != nil {
			return res, fmt.Errorf("ending an empty claim: %w", err)
		}
		if len(undefer) > 0 {
			r.undefer = nil
		}
		return res, nil
	}
	r.cfg.Metrics.BatchSize.Observe(float64(len(batch)))
	if err := r.standby.Await(ctx, conn); err != nil {
		// The rows stay pending, uncharged: the rollback releases them,
		// and the relay backs off as from any Postgres outage.
		return res, err
	}

	// Publish only what can be published in order: an undecodable row, and
	// the later rows of its aggregate, stay behind it.
	held := map[string]bool{} // aggregates with an earlier row of this batch not published
	var sends []publish.Claimed
	for _, c := range batch {
		switch {
		case c.Undecodable != nil:
			held[c.Aggregate] = true
		case !held[c.Aggregate]:
			sends = append(sends, c)
		}
	}
	errs := publish.Send(ctx, r.writer, r.cfg.PublishTimeout, sends)
	if ctx.Err() != nil {
		return res, ctx.Err() // leave the rows pending; the next run republishes them
	}
	if err := faultpoint.Pass(ctx, faultpoint.OutboxAfterAck); err != nil {
		return res, err
	}
	cause := make(map[int64]error, len(sends))
	for i, c := range sends {
		cause[c.ID] = errs[i]
	}

	res.claimed = len(batch)
	var (
		published             []int64
		failed                []publish.Claimed
		failedCauses          []error
		deferIDs, deferDelays []int64
		deferErrs             []string
		brokerTopics          = map[string]bool{}
		okTopics              = map[string]bool{}
	)
	clear(held)
	now := time.Now()
	for _, c := range batch {
		err, sent := cause[c.ID]
		if c.Undecodable != nil {
			err = c.Undecodable
		}
		if sent && err != nil && !kafkaerr.IsMessageError(err) && !errors.Is(err, publish.ErrHeldBack) {
			r.cfg.Metrics.KafkaErrors.Inc()
		}
		switch {
		case held[c.Aggregate] || errors.Is(err, publish.ErrHeldBack):
			// An earlier event of this aggregate failed: leave this one
			// pending and untouched, so that it is retried after that event
			// and keeps order. writeTopic did not give it to the broker; the
			// failed row now holds the aggregate back (claimBatch).
		case err == nil:
			published = append(published, c.ID)
			okTopics[c.Msg.Topic] = true
			r.refused.take(c.Msg.Topic, c.Aggregate)
			r.cfg.Metrics.PublishLag.Observe(now.Sub(c.CreatedAt).Seconds())
			if c.Attempts > 0 {
				r.cfg.Metrics.Retries.Inc()
			}
		case c.Undecodable != nil || kafkaerr.IsMessageError(err):
			held[c.Aggregate] = true
			res.judged++
			if c.Undecodable == nil {
				okTopics[c.Msg.Topic] = true
			}
			failed, failedCauses = append(failed, c), append(failedCauses, err)
		default:
			held[c.Aggregate] = true
			brokerTopics[c.Msg.Topic] = true
			r.refused.refuse(c.Msg.Topic, c.Aggregate, now)
			if res.brokerErr == nil {
				res.brokerErr = err
			}
			// Deferred by how long this topic has been failing, so a topic
			// that stays unavailable is retried ever less often while the
			// other topics flow.
			delay := retry.Backoff(r.topicStreak[c.Msg.Topic]+1, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)
			deferIDs, deferErrs, deferDelays = append(deferIDs, c.ID), append(deferErrs, err.Error()), append(deferDelays, delay.Microseconds())
			if r.deferredTypes[c.Msg.Topic] == nil {
				r.deferredTypes[c.Msg.Topic] = map[string]bool{}
			}
			r.deferredTypes[c.Msg.Topic][c.AggType] = true
		}
	}

	finish := &pgx.Batch{}
	delays := make([]time.Duration, len(failed))
	for i, c := range failed {
		r.cfg.Metrics.Failures.Inc()
		delays[i] = retry.Backoff(c.Attempts+1, r.cfg.BackoffMin, r.cfg.BackoffMax)
		finish.Queue(markFailed, c.ID, failedCauses[i].Error(), delays[i].Microseconds(), r.cfg.MaxAttempts)
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
	r.cfg.Metrics.RoundTrips.WithLabelValues("commit").Inc()
	states, marked, err := readFinish(conn.SendBatch(ctx, finish), len(failed), len(published) > 0)
	if err != nil {
		return res, err
	}
	inTx = false
	res.disarmed = disarming
	if marked != int64(len(published)) {
		// The claim holds the rows locked, so this is a bug, not a race: seen.
		r.cfg.Metrics.set().Refuse(ctx, r.cfg.Logger, lifecycle.TransitionMarkPublished, "claimed rows were not pending when marked published",
			slog.Int("published", len(published)), slog.Int64("marked", marked))
	}
	for i, c := range failed {
		if states[i] == "" {
			r.cfg.Metrics.set().Refuse(ctx, r.cfg.Logger, lifecycle.TransitionMarkFailed, "a claimed row was not pending when its failure was recorded",
				slog.Int64("outbox_id", c.ID))
			continue
		}
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
	r.cfg.Metrics.Published.Add(float64(len(published)))
	return res, nil
}

// readClaim reads the results of the claim's pipeline, in the order
// relayBatch queued them, and reports whether arming took.
func (r *Relay) readClaim(b *pgx.Batch, br pgx.BatchResults, arming bool) (batch []publish.Claimed, armed bool, err error) {
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
		if arming && b.QueuedQueries[i].SQL == arm {
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
func readFinish(br pgx.BatchResults, failed int, published bool) (states []string, marked int64, err error) {
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("committing batch: %w", cerr)
		}
	}()
	states = make([]string, failed)
	for i := range states {
		// No row: it was not pending (markFailed names the state it
		// expects); states[i] stays "" and the caller counts it refused.
		if err := br.QueryRow().Scan(&states[i]); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, 0, fmt.Errorf("recording failed publish: %w", err)
		}
	}
	if published {
		tag, err := br.Exec()
		if err != nil {
			return nil, 0, fmt.Errorf("marking published: %w", err)
		}
		marked = tag.RowsAffected()
	}
	return states, marked, nil
}

// scanClaimed reads one claimed row. A row whose headers cannot be decoded
// is returned with undecodable set rather than failing the claim: the claim
// would fail the same way on every try, and nothing else would ever move.
func (r *Relay) scanClaimed(row pgx.CollectableRow) (publish.Claimed, error) {
	var (
		c       publish.Claimed
		ev      event.Envelope
		headers []byte
	)
	// *[16]byte, not *uuid.UUID: pgx decodes it natively instead of
	// through sql.Scanner and text, a tenth of the claim's CPU.
	err := row.Scan(&c.ID, (*[16]byte)(&ev.EventID), &ev.AggregateType, &ev.AggregateID, &ev.AggregateVersion,
		&ev.EventType, &ev.EventVersion, &ev.Payload, &headers, &ev.OccurredAt, &c.CreatedAt, &c.Attempts)
	if err != nil {
		return c, err
	}
	c.AggType = ev.AggregateType
	c.Aggregate = ev.AggregateType + "\x00" + ev.AggregateID
	var h publish.Headers
	if err := json.Unmarshal(headers, &h); err != nil {
		c.Msg.Topic = r.cfg.Topic(ev.AggregateType)
		c.Undecodable = fmt.Errorf("%w: event %s: decoding the headers column: %w", publish.ErrUndecodable, ev.EventID, err)
		return c, nil
	}
	ev.CorrelationID, ev.CausationID, ev.Traceparent = h.CorrelationID, h.CausationID, h.Traceparent
	c.Msg = event.ToKafka(r.cfg.Topic(ev.AggregateType), ev)
	return c, nil
}

// logFailed logs a row whose publish failed because of the message, now
// that its new state is committed.
func (r *Relay) logFailed(ctx context.Context, c publish.Claimed, cause error, delay time.Duration, state string) {
	log := r.cfg.Logger.With(slog.Int64("outbox_id", c.ID), slog.String("topic", c.Msg.Topic),
		slog.Int("attempt", c.Attempts+1), slog.Any("error", cause))
	if state == "dead" {
		r.cfg.Metrics.DeadTotal.Inc()
		log.ErrorContext(ctx, "outbox event is dead after its last attempt; its aggregate's later events wait until it is requeued")
		return
	}
	log.WarnContext(ctx, "outbox publish failed because of the message; will retry", slog.Duration("retry_in", delay))
}
