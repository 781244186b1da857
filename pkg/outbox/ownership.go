package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

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
