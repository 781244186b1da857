package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/event/retry"
	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
	"github.com/onceflow/onceflow/pkg/platform/pgutil"
)

// Handler applies one event's side effects using tx, the transaction the
// inbox row is written in. It must not commit or roll back tx. An error
// wrapping ErrPermanent or event.ErrInvalid dead-letters the event at once;
// any other error is retried.
type Handler func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error

// ErrPermanent marks a handler error that no retry can fix.
var ErrPermanent = errors.New("permanent failure")

// Permanent wraps err so the consumer dead-letters instead of retrying.
func Permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// Writer publishes dead letters; *kafka.Writer satisfies it.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

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
	// Upcasters convert older event versions to the current one.
	Upcasters []Upcaster
	// CrashPoint, when set, is called at each named crash point (see
	// CrashAfterCommit); a non-nil error stops the consumer right there, as
	// a crash would. Fault-injection harnesses use it; leave it nil otherwise.
	CrashPoint func(name string) error
	// LeaseTTL is how long a leased message (NewLeaseConsumer) stays with
	// its worker; it must exceed the longest side effect call. Default 30s.
	LeaseTTL time.Duration
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
// missing Name, a negative count or duration, an unknown gap policy, or
// backoff bounds the wrong way round. It checks c as NewConsumer would use
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
	d := c.WithDefaults()
	if d.BackoffMin > d.BackoffMax {
		return fmt.Errorf("inbox: Config.BackoffMin (%v) exceeds BackoffMax (%v)", d.BackoffMin, d.BackoffMax)
	}
	return nil
}

// Consumer handles the messages of one topic, in one consumer group,
// through the inbox.
type Consumer struct {
	pool      *pgxpool.Pool
	group     GroupConfig
	dlq       Writer
	handle    Handler
	cfg       Config
	upcasters map[string]map[int]Upcaster
	effect    *Effect // lease mode, when set
	kafka, db *fault
}

// NewConsumer returns a consumer that reads src's topic as a member of its
// consumer group, handles each event with h in a transaction on pool, and
// dead-letters through dlq.
func NewConsumer(pool *pgxpool.Pool, src GroupConfig, dlq Writer, h Handler, cfg Config) (*Consumer, error) {
	if pool == nil || dlq == nil || h == nil {
		return nil, errors.New("inbox: NewConsumer needs a pool, a dead-letter writer and a handler")
	}
	if err := src.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Consumer{pool: pool, group: src.WithDefaults(), dlq: dlq, handle: h, cfg: cfg.WithDefaults(),
		upcasters: map[string]map[int]Upcaster{}}
	c.cfg.Metrics.init(cfg.Name)
	m := c.cfg.Metrics
	c.kafka = newFault("kafka", cfg.Name, c.cfg.Logger, c.cfg.ErrorLogInterval, m.kafkaErrors, m.kafkaConnected)
	c.db = newFault("database", cfg.Name, c.cfg.Logger, c.cfg.ErrorLogInterval, m.dbErrors, m.dbConnected)
	for _, u := range cfg.Upcasters {
		if u.EventType == "" || u.From < 1 || u.Convert == nil {
			return nil, fmt.Errorf("inbox: upcaster %+v needs an event type, a version >= 1 and a Convert", u)
		}
		if c.upcasters[u.EventType] == nil {
			c.upcasters[u.EventType] = map[int]Upcaster{}
		}
		c.upcasters[u.EventType][u.From] = u
	}
	return c, nil
}

// errAbandoned ends the handling of a message this member no longer owns
// (its generation was dropped) or may no longer work on (the shutdown grace
// is over); the message is fetched again by whoever owns its partition.
var errAbandoned = errors.New("message abandoned")

// crashError is a crash point firing: the one error that stops Run.
type crashError struct{ err error }

func (e *crashError) Error() string { return e.err.Error() }
func (e *crashError) Unwrap() error { return e.err }

// Run consumes until ctx ends. Broker and database outages are waited out
// (see doc.go for how errors are classified); Run returns only after ctx
// ended, with nil, or when a crash point fires. On the way out, the work in
// hand gets ShutdownGrace to finish and have its offsets committed; what is
// still unfinished then is abandoned and redelivered later.
func (c *Consumer) Run(ctx context.Context) error {
	// The work in hand outlives ctx by ShutdownGrace at most.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownGrace, cancelWork) })
	defer stopGrace()
	// A crash point stops the whole consumer: fetching and the other workers.
	ctx, stop := context.WithCancel(ctx)
	defer stop()

	queues := make([]chan delivery, c.cfg.Workers)
	crashed := make(chan error, c.cfg.Workers)
	var workers, side sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan delivery, c.cfg.BatchSize)
		workers.Add(1)
		go func() {
			defer workers.Done()
			if err := c.worker(work, queues[i]); err != nil {
				crashed <- err
				stop()
				cancelWork()
			}
		}()
	}
	side.Add(2)
	go func() { defer side.Done(); c.reportDeadLetters(ctx) }()
	go func() { defer side.Done(); c.reportLag(ctx) }()

	c.consume(ctx, func(ctx context.Context, d delivery) bool {
		select {
		case queues[workerFor(d.m.Key, len(queues))] <- d:
			return true
		case <-ctx.Done():
			return false
		}
	})
	for _, q := range queues {
		close(q)
	}
	workers.Wait()
	side.Wait()
	close(crashed)
	var runErr error
	for err := range crashed {
		runErr = errors.Join(runErr, err)
	}
	return runErr
}

// Handle runs msgs through the inbox as Run runs the messages it fetches —
// in one batch: the inbox row, the version guard and the handler in one
// transaction, retries with backoff, dead letters through the consumer's
// dead-letter writer; in lease mode, each through the lease and the Effect —
// but commits no offset, since msgs did not come from the consumer group.
// It is for callers that fetch messages themselves (a replay from a file,
// a test: inboxtest.Deliver runs handlers through it without Kafka).
//
// It returns nil once every message is settled (handled, skipped as a
// duplicate or stale, or dead-lettered), or an error when ctx ended first
// or a crash point fired.
func (c *Consumer) Handle(ctx context.Context, msgs ...kafka.Message) error {
	batch := make([]delivery, len(msgs))
	for i, m := range msgs {
		batch[i] = delivery{m: m}
	}
	if c.effect == nil {
		if err := c.processBatch(ctx, batch); err != nil {
			return err
		}
		return ctx.Err()
	}
	for _, d := range batch {
		if err := c.processLeased(ctx, d); err != nil {
			return err
		}
		if err := c.committed(ctx, []delivery{d}); err != nil {
			return err
		}
	}
	return nil
}

func workerFor(key []byte, n int) int {
	h := fnv.New32a()
	_, _ = h.Write(key)
	return int(h.Sum32() % uint32(n))
}

// worker handles its queue in batches until the queue closes. Messages of a
// generation that ended are skipped: their partition's next owner fetches
// them again from the committed offset. It returns only a crash.
func (c *Consumer) worker(ctx context.Context, q <-chan delivery) error {
	for d := range q {
		if ctx.Err() != nil || !d.gen.begin() {
			continue
		}
		batch := []delivery{d}
	fill:
		for len(batch) < c.cfg.BatchSize {
			select {
			case next, ok := <-q:
				if !ok {
					break fill
				}
				if next.gen.begin() {
					batch = append(batch, next)
				}
			default:
				break fill
			}
		}
		var err error
		if c.effect != nil {
			for i, d := range batch {
				if err = c.processLeased(ctx, d); err == nil {
					err = c.committed(ctx, batch[i:i+1])
				} else {
					d.gen.finish(d.m, false)
				}
				if crash := (*crashError)(nil); errors.As(err, &crash) {
					for _, rest := range batch[i+1:] {
						rest.gen.finish(rest.m, false)
					}
					break
				}
			}
		} else {
			err = c.processBatch(ctx, batch)
		}
		var crash *crashError
		if errors.As(err, &crash) {
			return err
		}
	}
	return nil
}

// outcome is what became of one message.
type outcome int

const (
	processed outcome = iota
	duplicate
	stale
	deadLettered
)

// processBatch handles batch in as few transactions as it can: one, unless
// a message fails transiently; then what came before it commits, it is
// retried alone with backoff, and the rest continues in a new transaction.
// Every message of batch is finished (done or abandoned) when it returns.
func (c *Consumer) processBatch(ctx context.Context, batch []delivery) (err error) {
	defer func() {
		for _, d := range batch {
			d.gen.finish(d.m, false)
		}
	}()
	for len(batch) > 0 {
		n := c.tryBatch(ctx, batch)
		if err := c.committed(ctx, batch[:n]); err != nil {
			batch = batch[n:]
			return err
		}
		batch = batch[n:]
		if len(batch) == 0 {
			return nil
		}
		if err := c.processAlone(ctx, batch[0]); err != nil {
			if ctx.Err() != nil {
				return err
			}
			// Its generation was dropped; the others may be of a newer one.
			batch[0].gen.finish(batch[0].m, false)
			batch = batch[1:]
			continue
		}
		err := c.committed(ctx, batch[:1])
		batch = batch[1:]
		if err != nil {
			return err
		}
	}
	return nil
}

// committed is called once msgs' database work committed: it passes the
// crash point, then lets their offsets be committed.
func (c *Consumer) committed(_ context.Context, msgs []delivery) error {
	if len(msgs) == 0 {
		return nil
	}
	if c.cfg.CrashPoint != nil {
		if err := c.cfg.CrashPoint(CrashAfterCommit); err != nil {
			for _, d := range msgs {
				d.gen.finish(d.m, false)
			}
			return &crashError{fmt.Errorf("crash point %s: %w", CrashAfterCommit, err)}
		}
	}
	for _, d := range msgs {
		d.gen.finish(d.m, true)
	}
	return nil
}

func messages(batch []delivery) []kafka.Message {
	ms := make([]kafka.Message, len(batch))
	for i, d := range batch {
		ms[i] = d.m
	}
	return ms
}

// tryBatch handles batch in one transaction. It first tries the fast path
// (fastBatch); when that cannot settle the whole batch, it handles the batch
// again with a savepoint per message, and returns how many messages it
// settled (handled, skipped or dead-lettered) before the first one that
// failed transiently; those are committed. When the database cannot be
// reached it settles none, and processAlone waits the outage out.
func (c *Consumer) tryBatch(ctx context.Context, batch []delivery) int {
	ms := messages(batch)
	if len(ms) > 1 && c.fastBatch(ctx, ms) {
		c.db.ok(ctx, "")
		return len(ms)
	}
	start := time.Now()
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.db.fail(ctx, "begin", err)
		}
		return 0
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	var counts [4]int
	n := 0
	for _, m := range ms {
		out, err := c.settle(ctx, tx, m, 1)
		if err != nil {
			break // transient: commit what came before, retry this one alone
		}
		counts[out]++
		n++
	}
	if err := tx.Commit(ctx); err != nil {
		if pgutil.IsUnavailable(err) {
			c.db.fail(ctx, "commit", err)
		} else if ctx.Err() == nil {
			c.cfg.Logger.WarnContext(ctx, "inbox batch commit failed; retrying its messages one by one",
				slog.String("consumer", c.cfg.Name), slog.Any("error", err))
		}
		return 0
	}
	c.db.ok(ctx, "")
	c.cfg.Metrics.record(c.cfg.Name, counts, n, time.Since(start))
	return n
}

// isOutage reports whether err is the database being unreachable rather
// than anything about the message: it is waited out, never counted as an
// attempt, and never dead-letters the message.
func isOutage(err error) bool { return pgutil.IsUnavailable(err) }

// wait sleeps for d, or returns errAbandoned when ctx ends (the shutdown
// grace is over) or the message's generation is dropped first.
func wait(ctx context.Context, gen *generation, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return errAbandoned
	case <-t.C:
	}
	if gen != nil && gen.isDropped() {
		return errAbandoned
	}
	return nil
}

// processAlone retries one failing message in its own transactions with
// backoff. Failures of the message (its handler, its commit) count toward
// MaxAttempts, after which it is dead-lettered; the database being
// unreachable does not count and is waited out with capped backoff. It
// returns errAbandoned when ctx ends or the message's generation is dropped.
func (c *Consumer) processAlone(ctx context.Context, d delivery) error {
	attempt, outages := 1, 0 // the batch was attempt 1
	var lastErr error
	for {
		delay := retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)
		if outages > 0 {
			delay = retry.Backoff(outages, c.cfg.BackoffMin, c.cfg.BackoffMax)
		}
		if err := wait(ctx, d.gen, delay); err != nil {
			return err
		}
		if attempt >= c.cfg.MaxAttempts && lastErr != nil {
			// The last allowed attempt failed outside the handler (its
			// commit): dead-letter without running it again.
			err := c.deadLetterAlone(ctx, d.m, nil, fmt.Errorf("gave up after %d attempts: %w", attempt, lastErr))
			switch {
			case err == nil:
				return nil
			case ctx.Err() != nil:
				return errAbandoned
			case isOutage(err):
				c.db.fail(ctx, "dead_letter", err)
				outages++
				continue
			}
			// The dead letter is published; only its empty transaction
			// failed. Moving on is all that is left to do.
			c.cfg.Logger.ErrorContext(ctx, "inbox dead-lettered a message but could not commit afterwards; moving on",
				slog.String("consumer", c.cfg.Name), slog.Any("error", err))
			return nil
		}
		start := time.Now()
		tx, err := c.pool.Begin(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return errAbandoned
			}
			c.db.fail(ctx, "begin", err)
			outages++
			continue
		}
		out, err := c.settle(ctx, tx, d.m, attempt+1)
		op := "handle"
		if err == nil {
			op = "commit"
			err = tx.Commit(ctx)
		}
		if err == nil {
			c.db.ok(ctx, "")
			var counts [4]int
			counts[out]++
			c.cfg.Metrics.record(c.cfg.Name, counts, 1, time.Since(start))
			return nil
		}
		_ = tx.Rollback(context.Background())
		switch {
		case ctx.Err() != nil:
			return errAbandoned
		case isOutage(err):
			c.db.fail(ctx, op, err)
			outages++
		default:
			c.db.ok(ctx, "")
			outages = 0
			attempt++
			if op == "commit" {
				lastErr = err
				c.cfg.Metrics.failures.WithLabelValues(c.cfg.Name).Inc()
				c.cfg.Logger.WarnContext(ctx, "inbox could not commit a message's transaction; retrying",
					slog.String("consumer", c.cfg.Name), slog.String("topic", d.m.Topic), slog.Int("partition", d.m.Partition),
					slog.Int64("offset", d.m.Offset), slog.Int("attempt", attempt), slog.Any("error", err))
			} else {
				lastErr = nil // settle logged and counted the handler's failure
			}
		}
	}
}

// fastBatch settles a whole batch in one transaction with set-based inbox
// work: one INSERT for every message's inbox row, one locked read and one
// upsert for the version guard, then the handlers one after another without
// savepoints. It is all or nothing: if any message is undecodable, needs an
// upcaster that fails, finds a version gap under GapRetry, or its handler
// fails, the transaction is rolled back and fastBatch returns false, and the
// caller takes the savepoint path, which settles each message on its own
// (retry, dead letter). Handlers run in a transaction that may roll back, as
// they always may.
func (c *Consumer) fastBatch(ctx context.Context, batch []kafka.Message) bool {
	start := time.Now()
	evs := make([]event.Envelope, len(batch))
	for i, m := range batch {
		ev, err := event.FromKafka(m)
		if err != nil {
			return false
		}
		evs[i] = ev
	}
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return false
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit

	fresh, err := c.insertBatch(ctx, tx, batch, evs)
	if err != nil {
		c.fastPathFailed(ctx, "recording in inbox", err)
		return false
	}
	outs := make([]outcome, len(batch))
	seen := make(map[uuid.UUID]bool, len(batch))
	var dups []event.Envelope
	for i, ev := range evs {
		if !fresh[ev.EventID] || seen[ev.EventID] {
			outs[i] = duplicate
			dups = append(dups, ev)
		}
		seen[ev.EventID] = true
	}
	if err := c.checkPayloads(ctx, tx, dups...); err != nil {
		c.fastPathFailed(ctx, "comparing duplicates' payloads", err)
		return false
	}
	var notes []func()
	if !c.cfg.DisableVersionGuard {
		if notes, err = c.guardBatch(ctx, tx, evs, outs); err != nil {
			c.fastPathFailed(ctx, "checking aggregate versions", err)
			return false
		}
	}
	var counts [4]int
	for i := range evs {
		counts[outs[i]]++
		if outs[i] != processed {
			continue
		}
		if err := c.invoke(ctx, tx, batch[i], &evs[i]); err != nil {
			c.fastPathFailed(ctx, "handling "+evs[i].EventID.String(), err)
			return false
		}
	}
	if err := tx.Commit(ctx); err != nil {
		c.fastPathFailed(ctx, "committing", err)
		return false
	}
	for _, note := range notes {
		note()
	}
	if counts[duplicate] > 0 {
		c.cfg.Logger.DebugContext(ctx, "inbox duplicates", slog.String("consumer", c.cfg.Name), slog.Int("count", counts[duplicate]))
	}
	c.cfg.Metrics.record(c.cfg.Name, counts, len(batch), time.Since(start))
	return true
}

func (c *Consumer) fastPathFailed(ctx context.Context, step string, err error) {
	c.cfg.Logger.DebugContext(ctx, "inbox batch falls back to one savepoint per message",
		slog.String("consumer", c.cfg.Name), slog.String("step", step), slog.Any("error", err))
}

const insertProcessedBatch = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash, processed_at)
SELECT $1, m.id, m.event_type, m.aggregate_id, m.aggregate_version, m.topic, m.kafka_partition,
       m.kafka_offset, 'processed', sha256(m.payload), now()
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::int[], $8::bigint[], $9::bytea[])
     AS m(id, event_type, aggregate_id, aggregate_version, topic, kafka_partition, kafka_offset, payload)
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING message_id`

// insertBatch records every message in the inbox in one statement and
// returns the ids that were new (a redelivered id finds its row and is not
// returned; within the batch, the first occurrence is the one inserted).
func (c *Consumer) insertBatch(ctx context.Context, tx pgx.Tx, batch []kafka.Message, evs []event.Envelope) (map[uuid.UUID]bool, error) {
	n := len(batch)
	// [16]byte, not uuid.UUID: pgx encodes and decodes it natively instead of
	// through driver.Valuer, sql.Scanner and text.
	ids, types, aggs, versions := make([][16]byte, n), make([]string, n), make([]string, n), make([]int64, n)
	topics, partitions, offsets, payloads := make([]string, n), make([]int32, n), make([]int64, n), make([][]byte, n)
	for i, m := range batch {
		ev := evs[i]
		ids[i], types[i], aggs[i], versions[i] = ev.EventID, ev.EventType, ev.AggregateID, ev.AggregateVersion
		topics[i], partitions[i], offsets[i], payloads[i] = m.Topic, int32(m.Partition), m.Offset, []byte(ev.Payload)
	}
	rows, err := tx.Query(ctx, insertProcessedBatch, c.cfg.Name, ids, types, aggs, versions, topics, partitions, offsets, payloads)
	if err != nil {
		return nil, err
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return nil, err
	}
	fresh := make(map[uuid.UUID]bool, len(inserted))
	for _, id := range inserted {
		fresh[uuid.UUID(id)] = true
	}
	return fresh, nil
}

type aggregateKey struct{ typ, id string }

const lockVersions = `
SELECT v.aggregate_type, v.aggregate_id, v.version
FROM inbox_aggregate_versions v
JOIN unnest($2::text[], $3::text[]) AS a(aggregate_type, aggregate_id)
  ON v.aggregate_type = a.aggregate_type AND v.aggregate_id = a.aggregate_id
WHERE v.consumer = $1
FOR UPDATE OF v`

const advanceVersions = `
INSERT INTO inbox_aggregate_versions (consumer, aggregate_type, aggregate_id, version)
SELECT $1, a.aggregate_type, a.aggregate_id, a.version
FROM unnest($2::text[], $3::text[], $4::bigint[]) AS a(aggregate_type, aggregate_id, version)
ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE
SET version = EXCLUDED.version, updated_at = now()
WHERE inbox_aggregate_versions.version < EXCLUDED.version`

// guardBatch is guardVersion for a batch: it marks stale messages in outs
// (and in the inbox), advances each aggregate's version once, and returns
// the log lines and gap counts to emit once the transaction commits. A gap
// under GapRetry is an error: the savepoint path retries that message.
func (c *Consumer) guardBatch(ctx context.Context, tx pgx.Tx, evs []event.Envelope, outs []outcome) ([]func(), error) {
	var keys []aggregateKey
	want := map[aggregateKey]bool{}
	for i, ev := range evs {
		k := aggregateKey{ev.AggregateType, ev.AggregateID}
		if outs[i] == processed && !want[k] {
			want[k] = true
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	typs, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		typs[i], ids[i] = k.typ, k.id
	}
	rows, err := tx.Query(ctx, lockVersions, c.cfg.Name, typs, ids)
	if err != nil {
		return nil, err
	}
	applied := map[aggregateKey]int64{}
	var k aggregateKey
	var v int64
	if _, err := pgx.ForEachRow(rows, []any{&k.typ, &k.id, &v}, func() error { applied[k] = v; return nil }); err != nil {
		return nil, err
	}

	var notes []func()
	var staleIDs []uuid.UUID
	for i, ev := range evs {
		if outs[i] != processed {
			continue
		}
		k := aggregateKey{ev.AggregateType, ev.AggregateID}
		prev, known := applied[k]
		switch {
		case !known || ev.AggregateVersion == prev+1:
		case ev.AggregateVersion <= prev:
			outs[i] = stale
			staleIDs = append(staleIDs, ev.EventID)
			notes = append(notes, func() {
				c.cfg.Logger.InfoContext(ctx, "inbox skipped a stale event", slog.String("consumer", c.cfg.Name),
					slog.String("event_id", ev.EventID.String()), slog.String("aggregate_id", ev.AggregateID),
					slog.Int64("version", ev.AggregateVersion), slog.Int64("applied_version", prev))
			})
			continue
		default: // a gap
			if c.cfg.Gaps == GapRetry {
				return nil, fmt.Errorf("aggregate %s: version %d follows %d", ev.AggregateID, ev.AggregateVersion, prev)
			}
			notes = append(notes, func() {
				c.cfg.Metrics.gaps.WithLabelValues(c.cfg.Name).Inc()
				c.cfg.Logger.WarnContext(ctx, "inbox sees a version gap", slog.String("consumer", c.cfg.Name),
					slog.String("event_id", ev.EventID.String()), slog.String("aggregate_id", ev.AggregateID),
					slog.Int64("version", ev.AggregateVersion), slog.Int64("applied_version", prev))
			})
		}
		applied[k] = ev.AggregateVersion
	}
	for i, k := range keys {
		typs[i], ids[i] = k.typ, k.id
	}
	versions := make([]int64, len(keys))
	for i, k := range keys {
		versions[i] = applied[k]
	}
	if _, err := tx.Exec(ctx, advanceVersions, c.cfg.Name, typs, ids, versions); err != nil {
		return nil, err
	}
	if len(staleIDs) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE inbox_messages SET status = 'stale' WHERE consumer = $1 AND message_id = ANY($2)`,
			c.cfg.Name, staleIDs); err != nil {
			return nil, err
		}
	}
	return notes, nil
}

const insertProcessed = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash, processed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'processed', sha256($9), now())
ON CONFLICT (consumer, message_id) DO NOTHING`

// settle decides one message inside tx: handled, duplicate, stale, or
// dead-lettered. It returns an error only for a transient failure (the
// savepoint is rolled back and the caller retries); attempt counts the
// tries so far, and the last allowed one dead-letters instead. A failure
// because the database is unreachable is never the message's: it is
// returned for the caller to wait out, whatever the attempt.
func (c *Consumer) settle(ctx context.Context, tx pgx.Tx, m kafka.Message, attempt int) (outcome, error) {
	ev, err := event.FromKafka(m)
	if err != nil {
		return deadLettered, c.deadLetter(ctx, tx, m, nil, err)
	}
	sp, err := tx.Begin(ctx) // a savepoint
	if err != nil {
		return 0, err
	}
	out, err := c.apply(ctx, sp, m, &ev)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return 0, err
		}
		return out, nil
	}
	if rbErr := sp.Rollback(ctx); rbErr != nil {
		return 0, rbErr
	}
	if ctx.Err() != nil || isOutage(err) {
		return 0, err
	}
	c.cfg.Metrics.failures.WithLabelValues(c.cfg.Name).Inc()
	permanent := isPermanent(err)
	if !permanent && attempt < c.cfg.MaxAttempts {
		c.cfg.Logger.WarnContext(ctx, "inbox handler failed; retrying",
			slog.String("consumer", c.cfg.Name), slog.String("event_id", ev.EventID.String()),
			slog.String("event_type", ev.EventType), slog.Int("attempt", attempt), slog.Any("error", err))
		return 0, err
	}
	if !permanent {
		err = fmt.Errorf("gave up after %d attempts: %w", attempt, err)
	}
	return deadLettered, c.deadLetter(ctx, tx, m, &ev, err)
}

// payloadMismatches returns which of the given redelivered events carry a
// payload other than the one first recorded (payload_hash, the sha256 the
// inbox stores with every row).
const payloadMismatches = `
SELECT m.id
FROM unnest($2::uuid[], $3::bytea[]) AS m(id, payload)
JOIN inbox_messages i ON i.consumer = $1 AND i.message_id = m.id
WHERE i.payload_hash <> sha256(m.payload)`

// checkPayloads compares redelivered events with the payload their inbox row
// recorded. A mismatch is a producer bug — one event id reused for another
// body — that dedupe would otherwise hide: the redelivery is still a no-op
// (the first body was applied), but it is logged and counted in
// inbox_payload_mismatches_total. It costs a query only when there are
// duplicates.
func (c *Consumer) checkPayloads(ctx context.Context, tx pgx.Tx, dups ...event.Envelope) error {
	if len(dups) == 0 {
		return nil
	}
	ids, payloads := make([][16]byte, len(dups)), make([][]byte, len(dups))
	for i, ev := range dups {
		ids[i], payloads[i] = ev.EventID, []byte(ev.Payload)
	}
	rows, err := tx.Query(ctx, payloadMismatches, c.cfg.Name, ids, payloads)
	if err != nil {
		return fmt.Errorf("comparing payloads of duplicates: %w", err)
	}
	bad, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return fmt.Errorf("comparing payloads of duplicates: %w", err)
	}
	for _, id := range bad {
		c.cfg.Metrics.payloadMismatches.WithLabelValues(c.cfg.Name).Inc()
		c.cfg.Logger.WarnContext(ctx, "inbox duplicate with another payload: the producer reused an event id; the first payload was applied, this one ignored",
			slog.String("consumer", c.cfg.Name), slog.String("event_id", uuid.UUID(id).String()))
	}
	return nil
}

// isPermanent reports whether no retry can make err go away: the handler
// said so (Permanent), the event broke its contract (event.ErrInvalid), or
// Postgres refused the data itself (pgutil.IsPermanent: SQLSTATE class 22,
// a NUL byte in a text column, say, or class 54).
func isPermanent(err error) bool {
	return errors.Is(err, ErrPermanent) || errors.Is(err, event.ErrInvalid) || pgutil.IsPermanent(err)
}

// apply is the inbox insert, the version guard, the upcasters and the
// handler, all in tx.
func (c *Consumer) apply(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope) (outcome, error) {
	tag, err := tx.Exec(ctx, insertProcessed, c.cfg.Name, ev.EventID, ev.EventType, ev.AggregateID,
		ev.AggregateVersion, m.Topic, m.Partition, m.Offset, []byte(ev.Payload))
	if err != nil {
		return 0, fmt.Errorf("recording in inbox: %w", err)
	}
	if tag.RowsAffected() == 0 {
		c.cfg.Logger.DebugContext(ctx, "inbox duplicate", slog.String("consumer", c.cfg.Name),
			slog.String("event_id", ev.EventID.String()), slog.String("event_type", ev.EventType))
		if err := c.checkPayloads(ctx, tx, *ev); err != nil {
			return 0, err
		}
		return duplicate, nil
	}
	if !c.cfg.DisableVersionGuard {
		isStale, err := c.guardVersion(ctx, tx, ev)
		if err != nil || isStale {
			return stale, err
		}
	}
	if err := c.invoke(ctx, tx, m, ev); err != nil {
		return 0, err
	}
	return processed, nil
}

// invoke upcasts ev and runs the handler in tx, in m's consumer span.
func (c *Consumer) invoke(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope) error {
	if err := c.upcast(ev); err != nil {
		return err
	}
	return c.handleTraced(ctx, tx, m, *ev)
}

// advanceVersion moves the consumer's high-water version of the aggregate
// forward (never back) and returns the previous one (NULL when unseen).
const advanceVersion = `
WITH prev AS (
    SELECT version FROM inbox_aggregate_versions
    WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
    FOR UPDATE
), up AS (
    INSERT INTO inbox_aggregate_versions (consumer, aggregate_type, aggregate_id, version)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE
    SET version = EXCLUDED.version, updated_at = now()
    WHERE inbox_aggregate_versions.version < EXCLUDED.version
)
SELECT (SELECT version FROM prev)`

// guardVersion reports whether ev is stale (at or below the version this
// consumer applied last for its aggregate) and reports gaps.
func (c *Consumer) guardVersion(ctx context.Context, tx pgx.Tx, ev *event.Envelope) (bool, error) {
	var prev *int64
	if err := tx.QueryRow(ctx, advanceVersion, c.cfg.Name, ev.AggregateType, ev.AggregateID, ev.AggregateVersion).Scan(&prev); err != nil {
		return false, fmt.Errorf("checking the aggregate version: %w", err)
	}
	switch {
	case prev == nil:
		return false, nil
	case ev.AggregateVersion <= *prev:
		if _, err := tx.Exec(ctx, `UPDATE inbox_messages SET status = 'stale' WHERE consumer = $1 AND message_id = $2`,
			c.cfg.Name, ev.EventID); err != nil {
			return false, err
		}
		c.cfg.Logger.InfoContext(ctx, "inbox skipped a stale event", slog.String("consumer", c.cfg.Name),
			slog.String("event_id", ev.EventID.String()), slog.String("aggregate_id", ev.AggregateID),
			slog.Int64("version", ev.AggregateVersion), slog.Int64("applied_version", *prev))
		return true, nil
	case ev.AggregateVersion > *prev+1:
		c.cfg.Metrics.gaps.WithLabelValues(c.cfg.Name).Inc()
		c.cfg.Logger.WarnContext(ctx, "inbox sees a version gap", slog.String("consumer", c.cfg.Name),
			slog.String("event_id", ev.EventID.String()), slog.String("aggregate_id", ev.AggregateID),
			slog.Int64("version", ev.AggregateVersion), slog.Int64("applied_version", *prev))
		if c.cfg.Gaps == GapRetry {
			return false, fmt.Errorf("aggregate %s: version %d follows %d; waiting for the missing ones",
				ev.AggregateID, ev.AggregateVersion, *prev)
		}
	}
	return false, nil
}

// upcast converts ev's payload to the newest version it has upcasters for.
func (c *Consumer) upcast(ev *event.Envelope) error {
	for {
		u, ok := c.upcasters[ev.EventType][ev.EventVersion]
		if !ok {
			return nil
		}
		p, err := u.Convert(ev.Payload)
		if err != nil {
			return Permanent(fmt.Errorf("upcasting %s v%d: %w", ev.EventType, ev.EventVersion, err))
		}
		ev.Payload, ev.EventVersion = p, ev.EventVersion+1
	}
}

const insertDeadLettered = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, last_error, payload_hash)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'dead_lettered', $9, sha256($10))
ON CONFLICT (consumer, message_id) DO UPDATE
SET status = 'dead_lettered', last_error = EXCLUDED.last_error, attempts = inbox_messages.attempts + 1`

// Dead-letter headers added to the original message's headers.
const (
	HeaderDLTReason    = "dlt-reason"
	HeaderDLTConsumer  = "dlt-consumer"
	HeaderDLTTopic     = "dlt-original-topic"
	HeaderDLTPartition = "dlt-original-partition"
	HeaderDLTOffset    = "dlt-original-offset"
	HeaderDLTFailedAt  = "dlt-failed-at"
)

// reasonClass is the reason label of a dead letter: ev is nil when the
// message did not decode.
func reasonClass(ev *event.Envelope, reason error) string {
	switch {
	case errors.Is(reason, event.ErrInvalid) && ev == nil:
		return ReasonUndecodable
	case errors.Is(reason, event.ErrInvalid):
		return ReasonInvalid
	case errors.Is(reason, ErrPermanent), pgutil.IsPermanent(reason):
		return ReasonPermanent
	default:
		return ReasonExhausted
	}
}

// DeadLetterBodyLimit is how much of a message's value a dead letter keeps
// when the dead-letter topic refuses the whole message (too large for the
// writer or the topic): the record then carries the first DeadLetterBodyLimit
// bytes and the HeaderDLTTruncated header, so the partition can move on and
// the message is still visible, with its coordinates, for an operator.
const DeadLetterBodyLimit = 64 << 10

// HeaderDLTTruncated, on a dead letter, holds the original value's size in
// bytes when the value was cut to DeadLetterBodyLimit.
const HeaderDLTTruncated = "dlt-truncated-from"

// deadLetter publishes m to the dead-letter topic with the reason, then, when
// the envelope decoded, records a dead_lettered inbox row in tx. It retries
// the publish while the broker is unreachable, until it succeeds or ctx ends
// (then it returns an error and the message is redelivered later); a message
// the topic refuses as it is goes there truncated.
func (c *Consumer) deadLetter(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, reason error) error {
	topic := c.cfg.DeadLetterTopic
	if topic == "" {
		topic = m.Topic + ".dlt"
	}
	dlt := []kafka.Header{
		{Key: HeaderDLTReason, Value: []byte(truncate(reason.Error(), 4<<10))},
		{Key: HeaderDLTConsumer, Value: []byte(c.cfg.Name)},
		{Key: HeaderDLTTopic, Value: []byte(m.Topic)},
		{Key: HeaderDLTPartition, Value: []byte(fmt.Sprint(m.Partition))},
		{Key: HeaderDLTOffset, Value: []byte(fmt.Sprint(m.Offset))},
		{Key: HeaderDLTFailedAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	}
	dl := kafka.Message{Topic: topic, Key: m.Key, Value: m.Value,
		Headers: append(append([]kafka.Header{}, m.Headers...), dlt...)}
	truncated := false
	for attempt := 1; ; attempt++ {
		err := c.dlq.WriteMessages(ctx, dl)
		if err == nil {
			c.kafka.ok(ctx, "dead_letter")
			break
		}
		if kafkautil.IsMessageError(err) && !truncated {
			// Too large (or otherwise refused) as it is: keep the
			// coordinates, the reason and the start of the body.
			truncated = true
			dl = truncatedDeadLetter(dl, m, dlt)
			c.cfg.Logger.WarnContext(ctx, "inbox dead-letters a message truncated; the topic refused it whole",
				slog.String("consumer", c.cfg.Name), slog.String("topic", m.Topic), slog.Int("partition", m.Partition),
				slog.Int64("offset", m.Offset), slog.Int("bytes", len(m.Value)), slog.Any("error", err))
			continue
		}
		if kafkautil.IsMessageError(err) {
			// Even the truncated record is refused: nothing more can be
			// kept in Kafka; the log line and the counter are the record.
			c.cfg.Logger.ErrorContext(ctx, "inbox could not dead-letter a message even truncated; moving on",
				slog.String("consumer", c.cfg.Name), slog.String("topic", m.Topic), slog.Int("partition", m.Partition),
				slog.Int64("offset", m.Offset), slog.Any("reason", reason), slog.Any("error", err))
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("inbox %s: dead-lettering %s/%d/%d: %w", c.cfg.Name, m.Topic, m.Partition, m.Offset, err)
		}
		c.kafka.fail(ctx, "dead_letter", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("inbox %s: dead-lettering %s/%d/%d: %w", c.cfg.Name, m.Topic, m.Partition, m.Offset, err)
		case <-time.After(retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)):
		}
	}
	c.cfg.Metrics.deadLettered.WithLabelValues(c.cfg.Name, reasonClass(ev, reason)).Inc()
	log := c.cfg.Logger.With(slog.String("consumer", c.cfg.Name), slog.String("topic", m.Topic),
		slog.Int("partition", m.Partition), slog.Int64("offset", m.Offset), slog.String("dead_letter_topic", topic),
		slog.Any("error", reason))
	if ev == nil {
		log.ErrorContext(ctx, "inbox dead-lettered a message it keeps no inbox row for")
		return nil
	}
	log.ErrorContext(ctx, "inbox dead-lettered an event", slog.String("event_id", ev.EventID.String()),
		slog.String("event_type", ev.EventType))
	// In a savepoint: a row Postgres refuses (its fields are what the
	// decoder let through) must not undo the batch; the message is in the
	// dead-letter topic either way.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("recording a dead letter: %w", err)
	}
	if _, err := sp.Exec(ctx, insertDeadLettered, c.cfg.Name, ev.EventID, ev.EventType, ev.AggregateID,
		ev.AggregateVersion, m.Topic, m.Partition, m.Offset, reason.Error(), []byte(ev.Payload)); err != nil {
		_ = sp.Rollback(ctx)
		if isOutage(err) || ctx.Err() != nil {
			return fmt.Errorf("recording a dead letter: %w", err)
		}
		log.ErrorContext(ctx, "inbox could not record a dead letter's inbox row; it is in the dead-letter topic only",
			slog.Any("row_error", err))
		return nil
	}
	return sp.Commit(ctx)
}

// truncatedDeadLetter is dl cut down to what any topic takes: the key and
// the original headers cut to 1 KiB each, the first DeadLetterBodyLimit bytes
// of the value, and the dead-letter headers.
func truncatedDeadLetter(dl, m kafka.Message, dlt []kafka.Header) kafka.Message {
	out := kafka.Message{Topic: dl.Topic, Key: []byte(truncate(string(m.Key), 1<<10))}
	out.Value = m.Value
	if len(out.Value) > DeadLetterBodyLimit {
		out.Value = out.Value[:DeadLetterBodyLimit]
	}
	for _, h := range m.Headers {
		out.Headers = append(out.Headers, kafka.Header{Key: truncate(h.Key, 256), Value: []byte(truncate(string(h.Value), 1<<10))})
	}
	out.Headers = append(out.Headers, dlt...)
	out.Headers = append(out.Headers, kafka.Header{Key: HeaderDLTTruncated, Value: []byte(fmt.Sprint(len(m.Value)))})
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
