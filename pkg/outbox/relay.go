package outbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/internal/writercheck"
	"github.com/onceflow/onceflow/pkg/outbox/internal/outage"
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
