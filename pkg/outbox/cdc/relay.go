package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/internal/writercheck"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/internal/outage"
	"github.com/onceflow/onceflow/pkg/outbox/internal/standby"
)

// Relay publishes the outbox from Postgres's logical replication stream
// instead of polling the table: the inserts into outbox_events (Enqueue)
// and the events written only to the WAL (Emit), through one pgoutput slot.
// It never updates a row. See the package documentation for what it
// guarantees; any number of Relays may run for one slot, one streams and
// the others stand by.
type Relay struct {
	pool     *pgxpool.Pool
	writer   outbox.Writer
	cfg      Config
	replConf *pgconn.Config

	stream, retention, lag *outage.Outage

	// stalled: the last stream failed on a change committed while the
	// publication was missing (publicationMissing); until a stream moves
	// past it, the relay does not call itself active.
	stalled atomic.Bool

	mu         sync.Mutex
	active     bool
	downTopics map[string]bool // topics whose writes fail for the broker's sake

	standby *standby.Gate // nil unless cfg.Standby.PublishReplicated
}

// NewRelay returns a log-based relay for the outbox in pool, writing to w.
func NewRelay(pool *pgxpool.Pool, w outbox.Writer, cfg Config) (*Relay, error) {
	if pool == nil || w == nil {
		return nil, errors.New("outbox: cdc.NewRelay needs a pool and a writer")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := writercheck.Check(w, true, "outbox: cdc.NewRelay"); err != nil {
		return nil, err
	}
	var (
		rc  *pgconn.Config
		err error
	)
	if cfg.ReplicationURL != "" {
		if rc, err = pgconn.ParseConfig(cfg.ReplicationURL); err != nil {
			return nil, fmt.Errorf("outbox: parsing the replication URL: %w", err)
		}
	} else {
		rc = pool.Config().ConnConfig.Config.Copy()
	}
	if rc.RuntimeParams == nil {
		rc.RuntimeParams = map[string]string{}
	}
	// A walsender for logical replication, bound to this database. The
	// relay reads timestamps in the ISO style (parseTimestamptz), in UTC
	// because it publishes them in UTC.
	rc.RuntimeParams["replication"] = "database"
	rc.RuntimeParams["DateStyle"] = "ISO"
	rc.RuntimeParams["TimeZone"] = "UTC"
	health := func(what string) *outage.Outage { return outage.New(what, cfg.Logger, cfg.LogInterval) }
	return &Relay{
		pool: pool, writer: w, cfg: cfg, replConf: rc,
		downTopics: map[string]bool{},
		stream:     health("streaming from the replication slot"),
		retention:  health("deleting confirmed outbox rows"),
		lag:        health("reading the slot gauges"),
		standby:    standby.NewGate(standby.Config(cfg.Standby), set(cfg.Metrics), cfg.Logger, cfg.LogInterval),
	}, nil
}

// Run streams, publishes and confirms until ctx ends, and returns nil then.
// Beside the stream, on goroutines of their own, it refreshes
// outbox_slot_lag_bytes and deletes confirmed rows. While another relay
// holds the slot it stands by and retries; a lost connection, Postgres
// restart or server-side timeout reconnects with capped backoff, and
// streaming resumes from the slot's confirmed position, so what was
// acknowledged by Kafka but not yet confirmed is published again (consumers
// dedupe by event id).
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { r.every(ctx, r.cfg.LagInterval, r.lag, "slot", r.refreshGauges) })
	wg.Go(func() { r.every(ctx, r.cfg.RetentionInterval, r.retention, "retention", r.deleteConfirmed) })

	streak, standing := 0, false
	for ctx.Err() == nil {
		err := r.streamOnce(ctx)
		r.setActive(false)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errStreamed // the stream ended without a reason: reconnect
		}
		streak++
		if errors.Is(err, errSlotBusy) {
			if !standing {
				r.cfg.Logger.InfoContext(ctx, "replication slot is held by another relay; standing by to take over", slog.String("slot", r.cfg.Slot))
				standing = true
			}
			streak = min(streak, 4) // a standby retries at a steady, short interval
		} else {
			standing = false
			r.cfg.Metrics.DbErrors.WithLabelValues("replication").Inc()
			if errors.Is(err, errPublicationMissing) {
				r.publicationMissing(ctx, err)
			}
			r.stream.Fail(ctx, err)
		}
		if !retry.Sleep(ctx, retry.Backoff(streak, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
			return nil
		}
		if errors.Is(err, errStreamed) {
			streak = 0
		}
	}
	return nil
}

// Prepare makes sure the publication and the slot exist, creating them on
// the first start, so that everything committed from now on is decoded. A
// service in outbox.ModeWAL calls it before it takes writes (Publisher.Prepare):
// until the slot exists nothing keeps what Emit writes, and events emitted
// before Run's first connection would be lost. In outbox.ModeCDC the table keeps
// them, and Run republishes them from it. A slot that exists, held by
// another relay or not, is left as it is. It returns only once the slot is
// consistent, whoever created it: a logical slot decodes only what commits
// after every transaction running at its creation has ended, so an event
// emitted while another instance is still creating it (42710) would be
// decoded by no one. Failures are retried with Run's backoff until ctx
// ends.
func (r *Relay) Prepare(ctx context.Context) error {
	for streak := 1; ; streak++ {
		err := r.prepareOnce(ctx)
		if err == nil {
			return nil // created here (CREATE_REPLICATION_SLOT returns once consistent), or found consistent
		}
		if errors.Is(err, errSlotBusy) {
			// Another instance is creating it, or streams from it.
			return r.waitConsistent(ctx)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.stream.Fail(ctx, err)
		if !retry.Sleep(ctx, retry.Backoff(streak, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
			return ctx.Err()
		}
	}
}

// waitConsistent waits until the slot exists with a confirmed position:
// Postgres sets confirmed_flush_lsn only once the slot is consistent, and
// shows NULL while its creator still waits for the transactions that were
// running. A slot dropped meanwhile (its creator died) is created here.
func (r *Relay) waitConsistent(ctx context.Context) error {
	for streak := 1; ; streak++ {
		var exists, consistent bool
		err := r.pool.QueryRow(ctx, slotConsistent, r.cfg.Slot).Scan(&exists, &consistent)
		switch {
		case err == nil && consistent:
			return nil
		case err == nil && !exists:
			return r.Prepare(ctx)
		case err != nil && ctx.Err() == nil:
			r.stream.Fail(ctx, fmt.Errorf("reading whether the slot is consistent: %w", err))
		}
		if !retry.Sleep(ctx, retry.Backoff(min(streak, 4), r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
			return ctx.Err()
		}
	}
}

func (r *Relay) prepareOnce(ctx context.Context) error {
	conn, err := r.connectToSlot(ctx)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// errStreamed marks a failure after the stream had started, so the next
// try does not inherit the backoff of earlier failures.
var errStreamed = errors.New("stream interrupted")

// Active reports whether this relay streams from the slot now (false: it
// stands by, reconnects, or every stream fails at a change it cannot
// decode: errPublicationMissing).
func (r *Relay) Active() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active && !r.stalled.Load()
}

// errPublicationMissing: pgoutput resolves the publication in each change's
// historic snapshot, so a change committed while the publication was
// dropped fails every stream with 42704 at that change, even after the
// publication was created again. The slot cannot move past it: the relay
// says so (outbox_slot_publication_missing_total, alert
// OutboxPublicationMissing), and the runbook drops the slot, which makes
// the relay replace it and republish the window from the table
// (docs/runbook-cdc.md, "A publication dropped and recreated").
var errPublicationMissing = errors.New("the publication " + Publication + " was missing when a change the slot must still decode was committed")

// sqlstateUndefinedObject is what pgoutput fails with when a publication
// it looks up does not exist.
const sqlstateUndefinedObject = "42704"

// publicationMissing counts and logs a stream that failed on a change
// committed while the publication was missing, and keeps the relay from
// calling itself active until a stream moves past it.
func (r *Relay) publicationMissing(ctx context.Context, err error) {
	r.cfg.Metrics.CDC.PublicationMissing.Inc()
	if !r.stalled.Swap(true) {
		mode := "table mode: drop the slot (SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '" +
			r.cfg.Slot + "' AND NOT active, repeated until it returns a row); the relay replaces it and republishes the window from the table"
		if r.cfg.Mode == outbox.ModeWAL {
			mode = "WAL-only mode: the events committed since the publication was dropped cannot be decoded; dropping the slot loses them " +
				"(reconcile from the domain tables, see the runbook)"
		}
		r.cfg.Logger.ErrorContext(ctx, "REPLICATION STREAM STALLED: a change the slot must decode was committed while the publication "+
			Publication+" was missing; the slot cannot move past it, whatever exists now. "+mode,
			slog.String("slot", r.cfg.Slot), slog.Any("error", err))
	}
}

// progressed clears the stall once a stream moved past a position.
func (r *Relay) progressed() {
	if r.stalled.Load() {
		r.stalled.Store(false)
	}
}

func (r *Relay) setActive(on bool) {
	r.mu.Lock()
	r.active = on
	r.mu.Unlock()
	if on {
		r.cfg.Metrics.SlotActive.Set(1)
	} else {
		r.cfg.Metrics.SlotActive.Set(0)
	}
}
