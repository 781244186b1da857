package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/event/retry"
	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
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
	// BatchSize is the most events written to Kafka at once. Default 500.
	BatchSize int
	// FlushDelay is how long committed events wait for more to join their
	// batch before they are written. Default 2ms: the stream usually has
	// the next commit already buffered, and a long delay is pure latency.
	FlushDelay time.Duration
	// StatusInterval is how often the relay reports its confirmed position
	// to the server (and asks for a keepalive while idle, so an idle slot's
	// position follows the server's WAL). It must be well under the server's
	// wal_sender_timeout (default 60s). Default 1s.
	StatusInterval time.Duration
	// LagInterval is how often outbox_slot_lag_bytes is refreshed. Default 2s.
	LagInterval time.Duration
	// RetentionInterval is how often rows of outbox_events that Kafka
	// acknowledged and the slot confirmed are deleted, in batches of
	// RetentionBatch (default 1000). Default 5s.
	RetentionInterval time.Duration
	// RetentionBatch is the most rows one retention DELETE removes.
	RetentionBatch int
	// Retain keeps confirmed rows this long after their insert, for a replay
	// after a lost slot (see the runbook) and for a transaction that
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
	// with the window whose events may not have been published.
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
	if c.BatchSize <= 0 {
		c.BatchSize = 500
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
// CreatedAt may never have reached Kafka.
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

	kafka, stream, retention, lag *outage

	mu     sync.Mutex
	active bool
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
		kafka:     health("publishing to Kafka"),
		stream:    health("streaming from the replication slot"),
		retention: health("deleting confirmed outbox rows"),
		lag:       health("reading the slot lag"),
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
	wg.Go(func() { r.every(ctx, r.cfg.LagInterval, r.lag, "slot", r.refreshLag) })
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
	if down, since, err := r.kafka.state(); down {
		h.KafkaConnected, h.KafkaDownSince, h.LastError = false, since, err.Error()
	}
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

const slotLag = `
SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
FROM pg_replication_slots WHERE slot_name = $1`

func (r *CDCRelay) refreshLag(ctx context.Context) error {
	var lag int64
	err := r.pool.QueryRow(ctx, slotLag, r.cfg.Slot).Scan(&lag)
	if isNoRows(err) {
		lag, err = 0, nil // no slot yet: nothing retained
	}
	if err != nil {
		return fmt.Errorf("reading the slot lag: %w", err)
	}
	r.cfg.Metrics.slotLag.Set(float64(lag))
	return nil
}

// deleteConfirmedBatch removes rows Kafka acknowledged and the slot
// confirmed. Only state 'pending': a row marked dead (its event was
// skipped) stays for the operator.
const deleteConfirmedBatch = `
DELETE FROM outbox_events WHERE id IN (
    SELECT id FROM outbox_events
    WHERE id <= (SELECT confirmed_id FROM outbox_cdc_slots WHERE slot_name = $1)
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

const recordSlot = `
INSERT INTO outbox_cdc_slots (slot_name, created_at, confirmed_lsn, confirmed_at, confirmed_id)
VALUES ($1, now(), $2::pg_lsn, now(), 0)
ON CONFLICT (slot_name) DO UPDATE SET created_at = now(), confirmed_lsn = $2::pg_lsn, confirmed_at = now()`

// recordHandMadeSlot records a slot the relay did not create.
const recordHandMadeSlot = `
INSERT INTO outbox_cdc_slots (slot_name, confirmed_lsn)
SELECT slot_name, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1
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
	r.cfg.Logger.ErrorContext(ctx, "REPLICATION SLOT LOST: replaced it with a new one; events committed in the window may never have been published: "+
		"replay them (table mode: run the polling relay, RELAY_MODE=poll, until outbox_pending_events is 0; see the runbook)",
		slog.String("slot", r.cfg.Slot), slog.Bool("invalidated", invalidated),
		slog.Time("window_from", lost.LastConfirmedAt), slog.Time("window_to", lost.CreatedAt),
		slog.String("last_confirmed_lsn", lost.LastConfirmedLSN), slog.String("new_slot_lsn", res.ConsistentPoint))
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

// cdcEvent is one event decoded from the stream.
type cdcEvent struct {
	claimed
	rowID int64 // outbox_events id; 0 for an emitted event
}

// streamer is the state of one replication connection.
type streamer struct {
	r    *CDCRelay
	conn *pgconn.PgConn

	relations map[uint32]*pglogrepl.RelationMessage
	inTx      bool
	txEvents  []cdcEvent

	batch    []cdcEvent
	batchEnd pglogrepl.LSN // commit end of the last transaction in batch
	flushAt  time.Time

	// Batches go to the publisher goroutine, which writes them to Kafka
	// one after the other, in order, and reports each acknowledged one on
	// acked; meanwhile this goroutine goes on reading the stream, so
	// decoding and Kafka's round trips overlap. Only this goroutine uses
	// the connection.
	toPublish chan pubBatch
	acked     chan pubResult
	inflight  int // batches handed over and not yet acknowledged

	confirmed   pglogrepl.LSN // acknowledged by Kafka (or holding no events)
	confirmedID int64
	recorded    pglogrepl.LSN // last confirmed position written to outbox_cdc_slots
	nextStatus  time.Time
}

// slotConfirmed is where the slot's stream resumes.
const slotConfirmed = `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`

func (r *CDCRelay) streamOnce(ctx context.Context) error {
	conn, err := pgconn.ConnectConfig(ctx, r.replConf)
	if err != nil {
		return fmt.Errorf("connecting for replication: %w", err)
	}
	// Closing without a last status update is what a crash does: the slot
	// keeps the last confirmed position, and the next relay starts there.
	defer conn.Close(context.Background()) //nolint:errcheck // the connection is done either way
	if err := r.ensurePublication(ctx, conn); err != nil {
		return err
	}
	if err := r.ensureSlot(ctx, conn); err != nil {
		return err
	}
	var start pglogrepl.LSN
	var lsnText string
	if err := r.pool.QueryRow(ctx, slotConfirmed, r.cfg.Slot).Scan(&lsnText); err != nil {
		return fmt.Errorf("reading the slot's confirmed position: %w", err)
	}
	if start, err = pglogrepl.ParseLSN(lsnText); err != nil {
		return fmt.Errorf("parsing the slot's confirmed position: %w", err)
	}
	// proto_version 1 suffices: pgoutput sends logical decoding messages
	// with messages 'true' since Postgres 14, and the relay needs no
	// streaming of in-progress transactions (proto 2), which would hand it
	// changes before their commit.
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + Publication + "'", "messages 'true'"},
	})
	if err != nil {
		return slotErr("starting replication", err)
	}
	r.setActive(true)
	r.stream.ok(ctx)
	r.cfg.Logger.InfoContext(ctx, "streaming the outbox from the replication slot", slog.String("slot", r.cfg.Slot),
		slog.String("from_lsn", start.String()))
	s := &streamer{r: r, conn: conn, relations: map[uint32]*pglogrepl.RelationMessage{}, confirmed: start, recorded: start,
		toPublish: make(chan pubBatch, 2), acked: make(chan pubResult, 4)}
	pubCtx, stopPublisher := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.publisher(pubCtx) })
	err = s.run(ctx)
	// What was handed over and not acknowledged is not confirmed: the next
	// stream starts before it.
	stopPublisher()
	close(s.toPublish)
	wg.Wait()
	if err != nil {
		return fmt.Errorf("%w: %w", errStreamed, err)
	}
	return nil
}

// pubBatch is a run of whole committed transactions, ending at end.
type pubBatch struct {
	events []cdcEvent
	end    pglogrepl.LSN
}

// pubResult reports a batch Kafka acknowledged (err nil), or why the
// publisher stopped.
type pubResult struct {
	end   pglogrepl.LSN
	maxID int64
	err   error
}

// publisher writes the batches in order until toPublish is closed or ctx
// ends; a batch is reported only once Kafka acknowledged all of it.
func (s *streamer) publisher(ctx context.Context) {
	for b := range s.toPublish {
		ok, err := s.publish(ctx, b.events)
		if err != nil {
			select {
			case s.acked <- pubResult{err: err}:
			case <-ctx.Done():
			}
			return
		}
		if !ok {
			return // ctx ended: unacknowledged, so unconfirmed
		}
		res := pubResult{end: b.end}
		for _, e := range b.events {
			res.maxID = max(res.maxID, e.rowID)
		}
		select {
		case s.acked <- res:
		case <-ctx.Done():
			return
		}
	}
}

// noteAcked moves the confirmed position over an acknowledged batch.
func (s *streamer) noteAcked(res pubResult) error {
	if res.err != nil {
		return res.err
	}
	s.inflight--
	s.confirmed = max(s.confirmed, res.end)
	s.confirmedID = max(s.confirmedID, res.maxID)
	s.nextStatus = time.Time{} // confirm now
	return nil
}

// handOver passes the pending batch to the publisher. While the publisher
// is behind (Kafka is slow or away) it waits, still answering the server
// with status updates so the walsender does not time out.
func (s *streamer) handOver(ctx context.Context) error {
	b := pubBatch{events: s.batch, end: s.batchEnd}
	for {
		wait := time.NewTimer(max(time.Until(s.nextStatus), 0))
		select {
		case s.toPublish <- b:
			wait.Stop()
			s.inflight++
			s.batch = nil
			return nil
		case res := <-s.acked:
			wait.Stop()
			if err := s.noteAcked(res); err != nil {
				return err
			}
		case <-wait.C:
			if err := s.sendStatus(ctx); err != nil {
				return err
			}
		case <-ctx.Done():
			wait.Stop()
			return nil
		}
	}
}

func (s *streamer) run(ctx context.Context) error {
	for ctx.Err() == nil {
		for drained := false; !drained; {
			select {
			case res := <-s.acked:
				if err := s.noteAcked(res); err != nil {
					return err
				}
			default:
				drained = true
			}
		}
		now := time.Now()
		if !now.Before(s.nextStatus) {
			if err := s.sendStatus(ctx); err != nil {
				return err
			}
		}
		if len(s.batch) > 0 && (len(s.batch) >= s.r.cfg.BatchSize || !now.Before(s.flushAt)) {
			if err := s.handOver(ctx); err != nil {
				return err
			}
			continue
		}
		deadline := s.nextStatus
		if len(s.batch) > 0 && s.flushAt.Before(deadline) {
			deadline = s.flushAt
		}
		recvCtx, cancel := context.WithDeadline(ctx, deadline)
		raw, err := s.conn.ReceiveMessage(recvCtx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("receiving: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", serverError(m))
		case *pgproto3.CopyData:
			if err := s.handle(ctx, m.Data); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *streamer) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parsing a keepalive: %w", err)
		}
		// Nothing in flight: every change before ServerWALEnd was sent and
		// handled, so the slot may move there (as Postgres's own apply
		// worker does); otherwise an idle outbox in a busy database would
		// pin WAL.
		if s.idle() && k.ServerWALEnd > s.confirmed {
			s.confirmed = k.ServerWALEnd
		}
		if k.ReplyRequested {
			s.nextStatus = time.Time{}
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parsing XLogData: %w", err)
		}
		return s.decode(ctx, x.WALData)
	}
	return nil
}

func (s *streamer) decode(ctx context.Context, wal []byte) error {
	msg, err := pglogrepl.Parse(wal)
	if err != nil {
		return fmt.Errorf("parsing a pgoutput message: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.BeginMessage:
		s.inTx, s.txEvents = true, s.txEvents[:0]
	case *pglogrepl.RelationMessage:
		s.relations[m.RelationID] = m
	case *pglogrepl.InsertMessage:
		rel := s.relations[m.RelationID]
		if rel == nil || rel.RelationName != "outbox_events" {
			return nil
		}
		ev, err := s.r.decodeRow(rel, m.Tuple)
		if err != nil {
			// A row Postgres accepted but the relay cannot read is a bug or
			// a schema the relay does not know; skipping it would lose it.
			return fmt.Errorf("decoding an outbox row: %w", err)
		}
		s.txEvents = append(s.txEvents, ev)
	case *pglogrepl.LogicalDecodingMessage:
		if m.Prefix != EmitPrefix || !m.Transactional {
			return nil
		}
		env, emitted, err := decodeEmitted(m.Content)
		if err != nil {
			return err
		}
		s.txEvents = append(s.txEvents, s.r.newEvent(env, emitted, 0))
	case *pglogrepl.CommitMessage:
		s.inTx = false
		if len(s.txEvents) == 0 {
			if len(s.batch) == 0 && s.inflight == 0 && m.TransactionEndLSN > s.confirmed {
				s.confirmed = m.TransactionEndLSN
			}
			return nil
		}
		if len(s.batch) == 0 {
			s.flushAt = time.Now().Add(s.r.cfg.FlushDelay)
		}
		s.batch = append(s.batch, s.txEvents...)
		s.txEvents = s.txEvents[:0]
		s.batchEnd = m.TransactionEndLSN
	}
	return nil
}

func (r *CDCRelay) newEvent(ev event.Envelope, createdAt time.Time, rowID int64) cdcEvent {
	return cdcEvent{rowID: rowID, claimed: claimed{
		id: rowID, createdAt: createdAt, aggType: ev.AggregateType,
		aggregate: ev.AggregateType + "\x00" + ev.AggregateID,
		msg:       event.ToKafka(r.cfg.Topic(ev.AggregateType), ev),
	}}
}

// decodeRow reads an outbox_events insert (pgoutput's text format) into
// the same envelope the polling relay reads from the table.
func (r *CDCRelay) decodeRow(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) (cdcEvent, error) {
	if tuple == nil || len(tuple.Columns) != len(rel.Columns) {
		return cdcEvent{}, errors.New("tuple does not match its relation")
	}
	var (
		ev        event.Envelope
		rowID     int64
		headers   envelopeHeaders
		createdAt time.Time
		err       error
	)
	for i, col := range rel.Columns {
		data := tuple.Columns[i].Data
		if tuple.Columns[i].DataType != pglogrepl.TupleDataTypeText {
			continue // null: only optional columns (last_error, published_at)
		}
		text := string(data)
		switch col.Name {
		case "id":
			rowID, err = strconv.ParseInt(text, 10, 64)
		case "event_id":
			ev.EventID, err = uuid.Parse(text)
		case "aggregate_type":
			ev.AggregateType = text
		case "aggregate_id":
			ev.AggregateID = text
		case "aggregate_version":
			ev.AggregateVersion, err = strconv.ParseInt(text, 10, 64)
		case "event_type":
			ev.EventType = text
		case "event_version":
			ev.EventVersion, err = strconv.Atoi(text)
		case "payload":
			ev.Payload = json.RawMessage(text)
		case "headers":
			err = json.Unmarshal(data, &headers)
		case "occurred_at":
			err = r.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, data, &ev.OccurredAt)
		case "created_at":
			err = r.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, data, &createdAt)
		}
		if err != nil {
			return cdcEvent{}, fmt.Errorf("column %s: %w", col.Name, err)
		}
	}
	ev.CorrelationID, ev.CausationID, ev.Traceparent = headers.CorrelationID, headers.CausationID, headers.Traceparent
	return r.newEvent(ev, createdAt, rowID), nil
}

// idle reports that nothing decoded is waiting for Kafka: no open
// transaction, no pending batch, none in flight.
func (s *streamer) idle() bool { return !s.inTx && len(s.batch) == 0 && s.inflight == 0 }

// sendStatus confirms s.confirmed to the server: the slot's
// confirmed_flush_lsn moves there, and the WAL before it may be recycled.
// While idle it asks for a keepalive, whose position the next status
// confirms.
func (s *streamer) sendStatus(ctx context.Context) error {
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.confirmed, ReplyRequested: s.idle(),
	})
	if err != nil {
		return fmt.Errorf("sending the standby status: %w", err)
	}
	s.nextStatus = time.Now().Add(s.r.cfg.StatusInterval)
	if s.confirmed != s.recorded {
		// Best effort: the record only dates a lost slot's window and
		// bounds retention; the slot itself is the source of truth.
		recCtx, cancel := context.WithTimeout(ctx, s.r.cfg.StatusInterval)
		_, err := s.r.pool.Exec(recCtx, recordConfirmed, s.r.cfg.Slot, s.confirmed.String(), s.confirmedID)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.r.cfg.Metrics.dbErrors.WithLabelValues("slot").Inc()
			}
		} else {
			s.recorded = s.confirmed
		}
	}
	return nil
}

// publish writes events until Kafka acknowledged every one of them and
// reports true; false if ctx ended first. Broker errors are waited out with
// capped backoff; an event Kafka refuses because of the message
// MaxAttempts times is skipped as dead. It runs on the publisher goroutine.
func (s *streamer) publish(ctx context.Context, todo []cdcEvent) (bool, error) {
	r := s.r
	attempts := make(map[int]int) // index into todo -> message-error attempts
	idx := make([]int, len(todo))
	for i := range idx {
		idx[i] = i
	}
	kafkaStreak := 0
	for len(idx) > 0 {
		batch := make([]claimed, len(idx))
		for j, i := range idx {
			batch[j] = todo[i].claimed
			// startSends rewrites the traceparent header: a retry starts
			// from the stored one again.
			batch[j].msg.Headers = append([]kafka.Header(nil), todo[i].msg.Headers...)
		}
		r.cfg.Metrics.batchSize.Observe(float64(len(batch)))
		endSends := startSends(ctx, batch)
		pubCtx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		errs := publishBatch(pubCtx, r.writer, batch)
		cancel()
		endSends(errs)
		if ctx.Err() != nil {
			return false, nil
		}
		var (
			retryIdx    []int
			brokerErr   error
			judged, ack int
		)
		now := time.Now()
		for j, i := range idx {
			switch err := errs[j]; {
			case err == nil:
				ack++
				r.cfg.Metrics.publishLag.Observe(now.Sub(todo[i].createdAt).Seconds())
				if attempts[i] > 0 {
					r.cfg.Metrics.retries.Inc()
				}
			case errors.Is(err, errHeldBack):
				// Not written: an earlier event of its aggregate failed. It
				// goes again with that one, uncharged, and after it.
				retryIdx = append(retryIdx, i)
			case kafkautil.IsMessageError(err):
				judged++
				attempts[i]++
				r.cfg.Metrics.failures.Inc()
				if attempts[i] >= r.cfg.MaxAttempts {
					s.dead(ctx, todo[i], err)
					continue
				}
				retryIdx = append(retryIdx, i)
			default:
				r.cfg.Metrics.kafkaErrors.Inc()
				if brokerErr == nil {
					brokerErr = err
				}
				retryIdx = append(retryIdx, i)
			}
		}
		r.cfg.Metrics.published.Add(float64(ack))
		if brokerErr != nil && ack == 0 && judged == 0 {
			kafkaStreak++
			r.cfg.Metrics.kafkaConnected.Set(0)
			r.kafka.fail(ctx, brokerErr)
		} else {
			kafkaStreak = 0
			r.cfg.Metrics.kafkaConnected.Set(1)
			r.kafka.ok(ctx)
		}
		idx = retryIdx
		if len(idx) == 0 {
			break
		}
		delay := retry.Backoff(max(kafkaStreak, 1), r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)
		if brokerErr == nil {
			delay = retry.Backoff(attempts[idx[0]], r.cfg.BackoffMin, r.cfg.BackoffMax)
		}
		if !sleep(ctx, delay) {
			return false, nil
		}
	}
	if r.cfg.CrashPoint != nil {
		if err := r.cfg.CrashPoint(CrashAfterAck); err != nil {
			return false, fmt.Errorf("crash point %s: %w", CrashAfterAck, err)
		}
	}
	return true, nil
}

const markDeadCDC = `UPDATE outbox_events SET state = 'dead', last_error = $2, attempts = $3 WHERE id = $1`

// dead skips an event Kafka keeps refusing because of the message: logged
// with its identity, counted in outbox_dead_total, and, for a table row,
// marked dead (retention keeps dead rows) so an operator can find it.
func (s *streamer) dead(ctx context.Context, e cdcEvent, cause error) {
	r := s.r
	r.cfg.Metrics.deadTotal.Inc()
	r.cfg.Logger.ErrorContext(ctx, "outbox event refused by Kafka because of the message; skipped as dead (its aggregate's later events go on)",
		slog.String("event_id", header(e.msg, event.HeaderEventID)), slog.String("topic", e.msg.Topic),
		slog.String("aggregate_id", string(e.msg.Key)), slog.Int64("outbox_id", e.rowID), slog.Any("error", cause))
	if e.rowID == 0 {
		return
	}
	if _, err := r.pool.Exec(ctx, markDeadCDC, e.rowID, cause.Error(), r.cfg.MaxAttempts); err != nil && ctx.Err() == nil {
		r.cfg.Metrics.dbErrors.WithLabelValues("slot").Inc()
		r.cfg.Logger.ErrorContext(ctx, "could not mark the skipped outbox row dead", slog.Int64("outbox_id", e.rowID), slog.Any("error", err))
	}
}
