package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// Publication is the publication migration 0005 creates on outbox_events
// inserts; CDCRelay streams it.
const Publication = "outbox_events_pub"

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

// LostSlot describes a replication slot the relay found dropped or
// invalidated and replaced. Events committed between LastConfirmedAt and
// CreatedAt (LastConfirmedLSN and the new slot's position) were in no
// slot's stream: in table mode (ModeCDC) the relay republishes them from
// the table before it streams; in WAL-only mode (ModeWAL) they are lost.
type LostSlot struct {
	Slot string
	// Invalidated is true when the slot existed with wal_status 'lost'
	// (max_slot_wal_keep_size exceeded), false when it was missing.
	Invalidated bool
	// LastConfirmedAt is when the lost slot last confirmed a position.
	LastConfirmedAt time.Time
	// LastConfirmedLSN is that position.
	LastConfirmedLSN string
	// CreatedAt is when the new slot was created; it streams from there.
	CreatedAt time.Time
}

// CDCRelay publishes the outbox from Postgres's logical replication stream
// instead of polling the table: the inserts into outbox_events (Enqueue)
// and the events written only to the WAL (Emit), through one pgoutput slot.
// It never updates a row. See the package documentation for what it
// guarantees; any number of CDCRelays may run for one slot, one streams and
// the others stand by.
type CDCRelay struct {
	pool     *pgxpool.Pool
	writer   Writer
	cfg      CDCConfig
	replConf *pgconn.Config
	types    *pgtype.Map

	stream, retention, lag *outage

	mu         sync.Mutex
	active     bool
	downTopics map[string]topicOutage // topics whose writes fail for the broker's sake
}

// NewCDCRelay returns a log-based relay for the outbox in pool, writing to w.
func NewCDCRelay(pool *pgxpool.Pool, w Writer, cfg CDCConfig) (*CDCRelay, error) {
	if pool == nil || w == nil {
		return nil, errors.New("outbox: NewCDCRelay needs a pool and a writer")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var rc *pgconn.Config
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
	// A walsender for logical replication, bound to this database.
	rc.RuntimeParams["replication"] = "database"
	health := func(what string) *outage { return newOutage(what, cfg.Logger, cfg.LogInterval) }
	return &CDCRelay{
		pool: pool, writer: w, cfg: cfg, replConf: rc, types: pgtype.NewMap(),
		downTopics: map[string]topicOutage{},
		stream:     health("streaming from the replication slot"),
		retention:  health("deleting confirmed outbox rows"),
		lag:        health("reading the slot gauges"),
	}, nil
}

// errSlotBusy: another relay streams from the slot (SQLSTATE 55006).
var errSlotBusy = errors.New("the replication slot is active in another relay")

// Run streams, publishes and confirms until ctx ends, and returns nil then.
// Beside the stream, on goroutines of their own, it refreshes
// outbox_slot_lag_bytes and deletes confirmed rows. While another relay
// holds the slot it stands by and retries; a lost connection, Postgres
// restart or server-side timeout reconnects with capped backoff, and
// streaming resumes from the slot's confirmed position, so what was
// acknowledged by Kafka but not yet confirmed is published again (consumers
// dedupe by event id).
func (r *CDCRelay) Run(ctx context.Context) error {
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
			r.cfg.Metrics.dbErrors.WithLabelValues("replication").Inc()
			r.stream.fail(ctx, err)
		}
		if !sleep(ctx, retry.Backoff(streak, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
			return nil
		}
		if errors.Is(err, errStreamed) {
			streak = 0
		}
	}
	return nil
}

// errStreamed marks a failure after the stream had started, so the next
// try does not inherit the backoff of earlier failures.
var errStreamed = errors.New("stream interrupted")

// Health reports what the relay knows about Kafka and Postgres now.
func (r *CDCRelay) Health() RelayHealth {
	h := RelayHealth{KafkaConnected: true, PostgresConnected: true}
	r.mu.Lock()
	for _, d := range r.downTopics {
		if h.KafkaConnected || d.since.Before(h.KafkaDownSince) {
			h.KafkaConnected, h.KafkaDownSince, h.LastError = false, d.since, d.err.Error()
		}
	}
	r.mu.Unlock()
	if down, since, err := r.stream.state(); down {
		h.PostgresConnected, h.PostgresDownSince, h.LastError = false, since, err.Error()
	}
	return h
}

// Active reports whether this relay streams from the slot now (false: it
// stands by, or reconnects).
func (r *CDCRelay) Active() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active
}

func (r *CDCRelay) setActive(on bool) {
	r.mu.Lock()
	r.active = on
	r.mu.Unlock()
	if on {
		r.cfg.Metrics.slotActive.Set(1)
	} else {
		r.cfg.Metrics.slotActive.Set(0)
	}
}

func (r *CDCRelay) every(ctx context.Context, interval time.Duration, o *outage, op string, f func(context.Context) error) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		callCtx, cancel := context.WithTimeout(ctx, max(interval, 5*time.Second))
		err := f(callCtx)
		cancel()
		switch {
		case err == nil:
			o.ok(ctx)
		case ctx.Err() == nil:
			r.cfg.Metrics.dbErrors.WithLabelValues(op).Inc()
			o.fail(ctx, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// refreshGauges reads the slot's gauges (readSlot, shared with
// Metrics.WatchSlot) and sets them.
func (r *CDCRelay) refreshGauges(ctx context.Context) error {
	s, err := readSlot(ctx, r.pool, r.cfg.Slot)
	if err != nil {
		return err
	}
	r.cfg.Metrics.setSlot(s)
	return nil
}

// deleteConfirmedBatch removes rows Kafka acknowledged and the slot
// confirmed. Only state 'pending': a row marked dead (its event was
// skipped) stays for the operator. Nothing while a new slot's gap has not
// been republished from the table: the gap's rows are still pending, and
// the new slot's confirmed id already passes them.
const deleteConfirmedBatch = `
DELETE FROM outbox_events WHERE id IN (
    SELECT id FROM outbox_events
    WHERE id <= (SELECT confirmed_id FROM outbox_cdc_slots WHERE slot_name = $1 AND NOT gap_pending)
      AND state = 'pending' AND created_at < now() - $2 * interval '1 microsecond'
    ORDER BY id LIMIT $3)`

func (r *CDCRelay) deleteConfirmed(ctx context.Context) error {
	for ctx.Err() == nil {
		tag, err := r.pool.Exec(ctx, deleteConfirmedBatch, r.cfg.Slot, r.cfg.Retain.Microseconds(), r.cfg.RetentionBatch)
		if err != nil {
			return fmt.Errorf("deleting confirmed outbox rows: %w", err)
		}
		if tag.RowsAffected() < int64(r.cfg.RetentionBatch) {
			return nil
		}
	}
	return nil
}

const publicationExists = `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`

// createPublication is migration 0005's publication, for when the
// migrating role could not create it.
const createPublication = `CREATE PUBLICATION ` + Publication + ` FOR TABLE outbox_events WITH (publish = 'insert')`

// ensurePublication creates the publication over the replication
// connection if migration 0005 could not (its role had no CREATE on the
// database); a walsender in database mode runs plain SQL too.
func (r *CDCRelay) ensurePublication(ctx context.Context, conn *pgconn.PgConn) error {
	var exists bool
	if err := r.pool.QueryRow(ctx, publicationExists, Publication).Scan(&exists); err != nil {
		return fmt.Errorf("looking for the publication: %w", err)
	}
	if exists {
		return nil
	}
	_, err := conn.Exec(ctx, createPublication).ReadAll()
	if isDuplicateObject(err) {
		return nil // another relay just created it
	}
	if err != nil {
		return fmt.Errorf("creating publication %s (migration 0005 could not: grant CREATE on the database to the migrating role, "+
			"or let REPLICATION_DATABASE_URL's role own outbox_events or be a superuser): %w", Publication, err)
	}
	r.cfg.Logger.InfoContext(ctx, "created the publication the migration could not", slog.String("publication", Publication))
	return nil
}

// slotState is the slot's row in pg_replication_slots and the relay's own
// record of it (outbox_cdc_slots).
const slotState = `
SELECT (SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()),
       (SELECT confirmed_lsn::text FROM outbox_cdc_slots WHERE slot_name = $1),
       (SELECT confirmed_at FROM outbox_cdc_slots WHERE slot_name = $1)`

// recordSlot records a new slot. Its stream starts at its creation, so the
// rows committed before it that were never published (a lost slot's gap,
// or rows left by the polling relay) are in no stream: gap_pending makes
// the relay republish the table's pending rows before it streams, and
// keeps retention off until it did (migration 0006).
const recordSlot = `
INSERT INTO outbox_cdc_slots (slot_name, created_at, confirmed_lsn, confirmed_at, confirmed_id, gap_pending)
VALUES ($1, now(), $2::pg_lsn, now(), 0, true)
ON CONFLICT (slot_name) DO UPDATE SET created_at = now(), confirmed_lsn = $2::pg_lsn, confirmed_at = now(), gap_pending = true`

// recordHandMadeSlot records a slot the relay did not create; what was
// committed before it is unknown, so its gap is replayed too.
const recordHandMadeSlot = `
INSERT INTO outbox_cdc_slots (slot_name, confirmed_lsn, gap_pending)
SELECT slot_name, confirmed_flush_lsn, true FROM pg_replication_slots WHERE slot_name = $1
ON CONFLICT DO NOTHING`

const recordConfirmed = `
UPDATE outbox_cdc_slots SET confirmed_lsn = $2::pg_lsn, confirmed_at = now(), confirmed_id = greatest(confirmed_id, $3)
WHERE slot_name = $1`

// ensureSlot makes sure the slot exists and is usable, creating it on the
// first start and replacing it, loudly, when it was lost.
func (r *CDCRelay) ensureSlot(ctx context.Context, conn *pgconn.PgConn) error {
	var (
		walStatus, lastLSN *string
		lastAt             *time.Time
	)
	if err := r.pool.QueryRow(ctx, slotState, r.cfg.Slot).Scan(&walStatus, &lastLSN, &lastAt); err != nil {
		return fmt.Errorf("reading the slot's state: %w", err)
	}
	if walStatus != nil && *walStatus != "lost" {
		if lastLSN == nil {
			// A slot made by hand: record it, so that losing it later is
			// noticed.
			if _, err := r.pool.Exec(ctx, recordHandMadeSlot, r.cfg.Slot); err != nil {
				return fmt.Errorf("recording the slot: %w", err)
			}
		}
		return nil
	}
	invalidated := walStatus != nil
	if invalidated {
		if err := pglogrepl.DropReplicationSlot(ctx, conn, r.cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
			return slotErr("dropping the invalidated slot", err)
		}
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, r.cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		return slotErr("creating the replication slot", err)
	}
	if _, err := r.pool.Exec(ctx, recordSlot, r.cfg.Slot, res.ConsistentPoint); err != nil {
		return fmt.Errorf("recording the new slot: %w", err)
	}
	if lastLSN == nil {
		r.cfg.Logger.InfoContext(ctx, "created the replication slot", slog.String("slot", r.cfg.Slot),
			slog.String("lsn", res.ConsistentPoint))
		return nil
	}
	lost := LostSlot{Slot: r.cfg.Slot, Invalidated: invalidated, LastConfirmedLSN: *lastLSN, CreatedAt: time.Now()}
	if lastAt != nil {
		lost.LastConfirmedAt = *lastAt
	}
	r.cfg.Metrics.slotLost.Inc()
	attrs := []any{slog.String("slot", r.cfg.Slot), slog.Bool("invalidated", invalidated),
		slog.Time("window_from", lost.LastConfirmedAt), slog.Time("window_to", lost.CreatedAt),
		slog.String("last_confirmed_lsn", lost.LastConfirmedLSN), slog.String("new_slot_lsn", res.ConsistentPoint),
		slog.String("mode", string(r.cfg.Mode))}
	if r.cfg.Mode == ModeWAL {
		// The price of writing no row: nothing but the WAL held these
		// events, and no slot decoded that range.
		r.cfg.Metrics.cdc.lostUnrecoverable.Inc()
		r.cfg.Logger.ErrorContext(ctx, "REPLICATION SLOT LOST, WAL-ONLY EVENTS LOST: replaced it with a new one; every event Emit wrote "+
			"between last_confirmed_lsn and new_slot_lsn that Kafka had not acknowledged is lost and cannot be republished: "+
			"reconcile from the domain tables (see the runbook)", attrs...)
	} else {
		r.cfg.Logger.ErrorContext(ctx, "REPLICATION SLOT LOST: replaced it with a new one; republishing the window's events from the "+
			"outbox table before streaming (retention waits until that is done)", attrs...)
	}
	if r.cfg.OnSlotLost != nil {
		r.cfg.OnSlotLost(lost)
	}
	return nil
}

// slotErr turns "the slot is active elsewhere" (55006) and "someone else
// just created it" (42710) into errSlotBusy, which a standby retries
// quietly.
func slotErr(what string, err error) error {
	if isObjectInUse(err) || isDuplicateObject(err) {
		return fmt.Errorf("%s: %w (%w)", what, errSlotBusy, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
