package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/event/periodic"
)

// The operator side of the inbox: prune the rows of handled events once no
// redelivery can reach them, see what went to a dead-letter topic and why,
// and requeue dead letters to their original topic once the cause is fixed.
// These functions are meant for an admin endpoint (see inboxhttp), a CLI or
// a background worker.
//
// Retention compares against the database's now(): processed_at was stamped
// by that clock, so the comparison is immune to skew between application
// hosts.

// DB is what the operator functions need from the caller's database handle.
// *pgxpool.Pool and *pgx.Conn satisfy it. Given a pgx.Tx, Prune's batches
// commit with the caller's transaction instead of one by one;
// RequeueDeadLetters refuses a pgx.Tx (see there).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// PruneConfig configures Prune. Zero fields take the documented defaults.
type PruneConfig struct {
	// Retention is how long the row of a handled event is kept after
	// processed_at. Default 30 days.
	//
	// The row is what makes a redelivery a no-op: once it is pruned, the
	// same event delivered again runs the handler again. So Retention must
	// be longer than any window in which the event can come back: the
	// retention of the topic in Kafka (a consumer group reset to the
	// earliest offset rereads all of it), plus the producer's replay window
	// (outbox.PruneConfig.Retention, since outbox.Replay republishes under
	// the original event ids), plus the time a dead letter may wait before
	// it is requeued.
	Retention time.Duration
	// BatchSize is the most rows removed per statement (and transaction), so
	// pruning a large backlog never holds many locks or a long transaction.
	// Default 1000.
	BatchSize int
}

// WithDefaults returns c with every zero field set to its documented
// default; negative values are kept for Validate to refuse.
func (c PruneConfig) WithDefaults() PruneConfig {
	if c.Retention == 0 {
		c.Retention = 30 * 24 * time.Hour
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	return c
}

// Validate refuses a negative Retention or BatchSize: a negative retention
// would prune rows the moment they are processed.
func (c PruneConfig) Validate() error {
	if c.Retention < 0 {
		return fmt.Errorf("inbox: PruneConfig.Retention is negative (%v); leave it zero for the default", c.Retention)
	}
	if c.BatchSize < 0 {
		return fmt.Errorf("inbox: PruneConfig.BatchSize is negative (%d); leave it zero for the default", c.BatchSize)
	}
	return nil
}

// pruneProcessed picks the oldest prunable rows once (MATERIALIZED: as a
// subquery in the WHERE clause, a LIMIT … FOR UPDATE may be re-run and
// remove more than the batch) and skips rows another pruner holds, so
// several pruners share the work. It reads the partial index on
// processed_at of migration 0003.
const pruneProcessed = `
WITH doomed AS MATERIALIZED (
    SELECT consumer, message_id FROM inbox_messages
    WHERE status IN ('processed', 'stale') AND processed_at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY processed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
DELETE FROM inbox_messages m
USING doomed d
WHERE m.consumer = d.consumer AND m.message_id = d.message_id`

// Prune removes processed and stale rows (stale: skipped by the version
// guard) whose processed_at is older than
// cfg.Retention and returns how many it removed. Dead-lettered rows are
// never touched, however old: they are the audit of what went to a
// dead-letter topic, and RequeueDeadLetters removes them when it sends the
// message back. It works oldest first in batches of cfg.BatchSize, each its
// own statement and short transaction, until a batch comes up short, so an
// interrupted Prune keeps what it removed and the next one resumes.
//
// On error the count is what the batches before the failure removed.
func Prune(ctx context.Context, db DB, cfg PruneConfig) (int, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	cfg = cfg.WithDefaults()
	total := 0
	for {
		tag, err := db.Exec(ctx, pruneProcessed, cfg.Retention.Microseconds(), cfg.BatchSize)
		if err != nil {
			return total, fmt.Errorf("inbox: pruning processed messages: %w", err)
		}
		n := int(tag.RowsAffected())
		total += n
		if n < cfg.BatchSize {
			return total, nil
		}
	}
}

// PrunerConfig configures a Pruner. Zero fields take the documented defaults.
type PrunerConfig struct {
	// PruneConfig is what each run prunes; see its fields' defaults.
	PruneConfig
	// Interval is the time between runs. Default 1h.
	Interval time.Duration
	// Logger receives each run's outcome. Default: slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with every zero field set to its documented
// default; negative values are kept for Validate to refuse.
func (c PrunerConfig) WithDefaults() PrunerConfig {
	c.PruneConfig = c.PruneConfig.WithDefaults()
	if c.Interval == 0 {
		c.Interval = time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate refuses what PruneConfig.Validate refuses, and a negative
// Interval.
func (c PrunerConfig) Validate() error {
	if err := c.PruneConfig.Validate(); err != nil {
		return err
	}
	if c.Interval < 0 {
		return fmt.Errorf("inbox: PrunerConfig.Interval is negative (%v); leave it zero for the default", c.Interval)
	}
	return nil
}

// Pruner runs Prune in the background, once at start and then every
// Interval. Several instances may run at once: batches skip rows another
// holds, so they share the work rather than collide.
type Pruner struct {
	db  DB
	cfg PrunerConfig
}

// NewPruner returns a pruner of the inbox in db.
func NewPruner(db DB, cfg PrunerConfig) (*Pruner, error) {
	if db == nil {
		return nil, errors.New("inbox: NewPruner needs a database")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Pruner{db: db, cfg: cfg.WithDefaults()}, nil
}

// Run prunes until ctx ends, then returns nil. A failed run is logged and
// retried at the next interval; it does not stop the pruner.
func (p *Pruner) Run(ctx context.Context) error {
	periodic.Run(ctx, p.cfg.Interval, p.pruneOnce)
	return nil
}

func (p *Pruner) pruneOnce(ctx context.Context) {
	n, err := Prune(ctx, p.db, p.cfg.PruneConfig)
	log := p.cfg.Logger.With(slog.Int("rows_removed", n), slog.Duration("retention", p.cfg.Retention))
	switch {
	case err != nil && ctx.Err() != nil:
		// Shutting down: the interrupted batch rolled back, nothing to report.
	case err != nil:
		log.ErrorContext(ctx, "inbox prune failed; retrying at the next interval", slog.Any("error", err))
	case n > 0:
		log.InfoContext(ctx, "inbox pruned processed messages")
	default:
		log.DebugContext(ctx, "inbox prune found nothing to remove")
	}
}

// DeadLetter describes one message of a dead-letter topic, from the headers
// the consumer added when it gave up on the message. Fields whose header is
// missing or unreadable keep their zero value; the Original coordinates are
// then -1.
type DeadLetter struct {
	// Partition and Offset locate the dead letter in the dead-letter topic.
	Partition int
	Offset    int64
	// Time is when the dead letter was appended to the dead-letter topic.
	Time time.Time

	// Reason is why the consumer gave up: the decode or handler error.
	Reason string
	// Consumer is the name (Config.Name) of the consumer that gave up.
	Consumer string
	// OriginalTopic, OriginalPartition and OriginalOffset locate the message
	// where the consumer read it.
	OriginalTopic     string
	OriginalPartition int
	OriginalOffset    int64
	// FailedAt is when the consumer gave up, by its clock.
	FailedAt time.Time

	// EventID, EventType and AggregateID come from the event's own headers;
	// they are empty for a message that is not an event at all.
	EventID     uuid.UUID
	EventType   string
	AggregateID string

	// KeySize and ValueSize are the lengths in bytes of the message's key
	// and value, which this listing leaves out.
	KeySize, ValueSize int
}

// dltHeaderPrefix marks the headers a dead-lettering adds; a requeue strips
// every header with it, including any a later version may add.
const dltHeaderPrefix = "dlt-"

func deadLetterOf(m kafka.Message) DeadLetter {
	h := make(map[string]string, len(m.Headers))
	for _, kv := range m.Headers {
		h[kv.Key] = string(kv.Value) // the last one wins: the latest dead-lettering
	}
	dl := DeadLetter{
		Partition: m.Partition, Offset: m.Offset, Time: m.Time,
		Reason: h[HeaderDLTReason], Consumer: h[HeaderDLTConsumer], OriginalTopic: h[HeaderDLTTopic],
		OriginalPartition: -1, OriginalOffset: -1,
		EventType: h[event.HeaderEventType], AggregateID: h[event.HeaderAggregateID],
		KeySize: len(m.Key), ValueSize: len(m.Value),
	}
	if p, err := strconv.Atoi(h[HeaderDLTPartition]); err == nil {
		dl.OriginalPartition = p
	}
	if o, err := strconv.ParseInt(h[HeaderDLTOffset], 10, 64); err == nil {
		dl.OriginalOffset = o
	}
	if t, err := time.Parse(time.RFC3339Nano, h[HeaderDLTFailedAt]); err == nil {
		dl.FailedAt = t
	}
	if id, err := uuid.Parse(h[event.HeaderEventID]); err == nil {
		dl.EventID = id
	}
	return dl
}

// ListDeadLetters returns up to limit dead letters of dltTopic, oldest
// first (by the time each was appended; the order within a partition is
// kept). A limit <= 0 means 100.
//
// It reads every partition from its first offset up to its high-water mark
// at the time of the call, with plain partition readers: no consumer group,
// no committed offset, so listing changes nothing and can be repeated. Dead
// letters stay in the topic after a requeue (Kafka topics are append-only);
// they leave it only through the topic's retention.
func ListDeadLetters(ctx context.Context, brokers []string, dltTopic string, limit int) ([]DeadLetter, error) {
	if limit <= 0 {
		limit = 100
	}
	var perPartition [][]DeadLetter
	err := readDeadLetterTopic(ctx, brokers, dltTopic, func(p int, m kafka.Message) (bool, error) {
		for len(perPartition) <= p {
			perPartition = append(perPartition, nil)
		}
		perPartition[p] = append(perPartition[p], deadLetterOf(m))
		return len(perPartition[p]) < limit, nil
	})
	if err != nil {
		return nil, err
	}
	// Merge the partitions by append time. Each partition contributes at most
	// limit letters, so the oldest limit overall are among them.
	out := []DeadLetter{}
	for len(out) < limit {
		best := -1
		for p, dls := range perPartition {
			if len(dls) > 0 && (best < 0 || dls[0].Time.Before(perPartition[best][0].Time)) {
				best = p
			}
		}
		if best < 0 {
			break
		}
		out = append(out, perPartition[best][0])
		perPartition[best] = perPartition[best][1:]
	}
	return out, nil
}

// ErrInvalidFilter is wrapped by the error of a RequeueDeadLetters whose
// filter selects nothing explicitly or contradicts itself.
var ErrInvalidFilter = errors.New("inbox: invalid requeue filter")

// RequeueFilter selects the dead letters RequeueDeadLetters sends back. A
// dead letter matches when it matches every field that is set.
type RequeueFilter struct {
	// Consumer selects the dead letters of one consumer (Config.Name).
	Consumer string
	// EventIDs selects the dead letters of these events. A message that was
	// not an event (it had no readable event id) never matches.
	EventIDs []uuid.UUID
	// All requeues every dead letter of the topic (of Consumer, if set). A
	// filter with neither Consumer nor EventIDs needs it, so that a
	// forgotten filter never floods a topic. It cannot be combined with
	// EventIDs.
	All bool
}

func (f RequeueFilter) validate() error {
	switch {
	case f.All && len(f.EventIDs) > 0:
		return fmt.Errorf("%w: All and EventIDs exclude each other", ErrInvalidFilter)
	case !f.All && len(f.EventIDs) == 0 && f.Consumer == "":
		return fmt.Errorf("%w: name the event ids or the consumer to requeue, or set All", ErrInvalidFilter)
	}
	return nil
}

func (f RequeueFilter) matches(dl DeadLetter) bool {
	if f.Consumer != "" && dl.Consumer != f.Consumer {
		return false
	}
	if len(f.EventIDs) == 0 {
		return true
	}
	for _, id := range f.EventIDs {
		if id == dl.EventID && id != uuid.Nil {
			return true
		}
	}
	return false
}

// requeueChunk bounds how many dead letters one delete statement and one
// WriteMessages call handle, and so how many RequeueDeadLetters holds in
// memory.
const requeueChunk = 100

// deleteDeadLettered removes the rows that would make the requeued messages
// look like duplicates. Only dead_lettered rows: a processed row means the
// event was handled since (by an earlier requeue), and must stay so that
// this redelivery is absorbed.
const deleteDeadLettered = `
DELETE FROM inbox_messages
WHERE status = 'dead_lettered'
  AND (consumer, message_id) IN (SELECT * FROM unnest($1::text[], $2::uuid[]))`

// RequeueDeadLetters sends the dead letters of dltTopic that match filter
// back to their original topic, oldest first within each partition, and
// returns how many it sent. For each one it first deletes the dead-lettering
// consumer's dead_lettered inbox row for the event (without that, the
// consumer would take the redelivery for a duplicate and skip it), then
// produces the original message through w: its key, value and headers, minus
// the dlt-* headers. Fix the cause of the failures before requeuing, or the
// messages come straight back.
//
// Only the dead letters present when the call began are read, so a requeued
// message that fails again and comes back to dltTopic meanwhile is not sent
// a second time by the same call.
//
// Requeue is at-least-once. The row is deleted before the message is
// produced, so a crash or a failed write in between leaves the dead letter
// in dltTopic for a later requeue, and its redelivery free to be handled; a
// message produced twice is absorbed by the inbox. Consequences worth knowing:
//   - The requeued message reaches every consumer of the original topic, not
//     only the one that gave up; the others absorb it as a duplicate (while
//     their inbox rows are within PruneConfig.Retention).
//   - Dead letters stay in dltTopic (see ListDeadLetters): a later requeue
//     whose filter matches them produces them again, harmlessly for events,
//     which are absorbed; a message that is not an event would be dead-lettered
//     again. Requeue by EventIDs to be selective.
//   - The message lands where w's balancer puts it: with kafkautil.NewWriter
//     (hashing the key) on its original partition, if the partition count did
//     not change, but after any later events of its aggregate. A consumer
//     whose version guard has already applied a later version of that
//     aggregate skips the requeued event as stale instead of handling it.
//
// w must not have a Topic of its own: each message names its original topic.
// db must not be a pgx.Tx: the deletes have to be committed before the
// messages are produced, or a rollback would leave a requeued event looking
// like a duplicate. A filter that selects nothing explicitly is refused with
// an error wrapping ErrInvalidFilter. On error the count is what was produced
// before the failing chunk.
func RequeueDeadLetters(ctx context.Context, db DB, w Writer, brokers []string, dltTopic string, filter RequeueFilter) (int, error) {
	if err := filter.validate(); err != nil {
		return 0, err
	}
	if _, ok := db.(pgx.Tx); ok {
		return 0, errors.New("inbox: RequeueDeadLetters needs a pool or a connection, not a transaction: its deletes must commit before it produces")
	}
	var (
		total     int
		consumers []string
		eventIDs  []uuid.UUID
		msgs      []kafka.Message
	)
	flush := func() error {
		if len(msgs) == 0 {
			return nil
		}
		if len(eventIDs) > 0 {
			if _, err := db.Exec(ctx, deleteDeadLettered, consumers, eventIDs); err != nil {
				return fmt.Errorf("inbox: deleting dead_lettered rows before requeuing: %w", err)
			}
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return fmt.Errorf("inbox: requeuing %d dead letters of %s: %w", len(msgs), dltTopic, err)
		}
		total += len(msgs)
		// Fresh slices: w may keep the ones it was given.
		consumers, eventIDs, msgs = nil, nil, nil
		return nil
	}
	err := readDeadLetterTopic(ctx, brokers, dltTopic, func(_ int, m kafka.Message) (bool, error) {
		dl := deadLetterOf(m)
		if !filter.matches(dl) {
			return true, nil
		}
		if dl.OriginalTopic == "" {
			return false, fmt.Errorf("inbox: dead letter %s/%d/%d has no %s header; cannot requeue it",
				dltTopic, m.Partition, m.Offset, HeaderDLTTopic)
		}
		if dl.EventID != uuid.Nil && dl.Consumer != "" {
			consumers = append(consumers, dl.Consumer)
			eventIDs = append(eventIDs, dl.EventID)
		}
		msgs = append(msgs, originalMessage(dl.OriginalTopic, m))
		if len(msgs) >= requeueChunk {
			return true, flush()
		}
		return true, nil
	})
	if err != nil {
		return total, err
	}
	return total, flush()
}

// originalMessage rebuilds the message the consumer read, minus the headers
// the dead-lettering added.
func originalMessage(topic string, dl kafka.Message) kafka.Message {
	m := kafka.Message{Topic: topic, Key: dl.Key, Value: dl.Value}
	for _, h := range dl.Headers {
		if !strings.HasPrefix(h.Key, dltHeaderPrefix) {
			m.Headers = append(m.Headers, h)
		}
	}
	return m
}

// readIdleTimeout bounds the wait for the next message of a partition that
// still has messages below its high-water mark, so a gap at the end of a
// partition (a compacted or aborted record) fails the listing instead of
// hanging it.
const readIdleTimeout = 10 * time.Second

// readDeadLetterTopic calls visit with every message of topic, partition by
// partition, each from its first offset up to the high-water mark it had
// when reading began. visit returns false to skip the rest of the partition.
func readDeadLetterTopic(ctx context.Context, brokers []string, topic string, visit func(partition int, m kafka.Message) (bool, error)) error {
	dialer := &kafka.Dialer{Timeout: 5 * time.Second}
	partitions, err := topicPartitions(ctx, brokers, topic)
	if err != nil {
		return err
	}
	for _, p := range partitions {
		first, last, err := partitionOffsets(ctx, dialer, brokers, p)
		if err != nil {
			return err
		}
		if first >= last {
			continue
		}
		if err := readPartition(ctx, dialer, brokers, p, last, visit); err != nil {
			return err
		}
	}
	return nil
}

// topicPartitions reads the partitions of topic, in id order, with a
// metadata request that does not ask the broker to create a missing topic
// (kafka.Conn.ReadPartitions does), and does not retry an unknown topic until
// ctx ends (kafka.Dialer.LookupPartitions does).
func topicPartitions(ctx context.Context, brokers []string, topic string) ([]kafka.Partition, error) {
	transport := &kafka.Transport{DialTimeout: 5 * time.Second}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: transport, Timeout: 10 * time.Second}
	res, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("inbox: reading the partitions of %s: %w", topic, err)
	}
	if len(res.Topics) != 1 {
		return nil, fmt.Errorf("inbox: reading the partitions of %s: the broker described %d topics", topic, len(res.Topics))
	}
	if err := res.Topics[0].Error; err != nil {
		return nil, fmt.Errorf("inbox: reading the partitions of %s: %w", topic, err)
	}
	partitions := res.Topics[0].Partitions
	for _, p := range partitions {
		if p.Error != nil {
			return nil, fmt.Errorf("inbox: reading the partitions of %s: partition %d: %w", topic, p.ID, p.Error)
		}
	}
	slices.SortFunc(partitions, func(a, b kafka.Partition) int { return cmp.Compare(a.ID, b.ID) })
	return partitions, nil
}

// partitionOffsets returns the first offset of p and its high-water mark,
// from p's leader (DialPartition is DialLeader without a second metadata
// lookup). A partition whose leader is moving, or was only just elected,
// answers with a temporary error for a moment: those are retried a few
// times, with the leader looked up afresh.
func partitionOffsets(ctx context.Context, dialer *kafka.Dialer, brokers []string, p kafka.Partition) (first, last int64, err error) {
	const attempts = 5
	for attempt := 1; ; attempt++ {
		first, last, err = readOffsets(ctx, dialer, p)
		var kerr kafka.Error
		if err == nil || attempt == attempts || !errors.As(err, &kerr) || !kerr.Temporary() {
			break
		}
		select {
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("inbox: reading the offsets of %s/%d: %w", p.Topic, p.ID, ctx.Err())
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
		partitions, perr := topicPartitions(ctx, brokers, p.Topic)
		if perr == nil && p.ID < len(partitions) {
			p = partitions[p.ID]
		}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("inbox: reading the offsets of %s/%d: %w", p.Topic, p.ID, err)
	}
	return first, last, nil
}

func readOffsets(ctx context.Context, dialer *kafka.Dialer, p kafka.Partition) (first, last int64, err error) {
	conn, err := dialer.DialPartition(ctx, "tcp", "", p)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	return conn.ReadOffsets()
}

func readPartition(ctx context.Context, dialer *kafka.Dialer, brokers []string, p kafka.Partition, end int64,
	visit func(int, kafka.Message) (bool, error)) error {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:        brokers,
		Topic:          p.Topic,
		Partition:      p.ID,
		Dialer:         dialer,
		StartOffset:    kafka.FirstOffset,
		MinBytes:       1,
		MaxBytes:       10 << 20,
		MaxWait:        100 * time.Millisecond,
		ReadBackoffMin: 10 * time.Millisecond,
		ReadBackoffMax: 100 * time.Millisecond,
	})
	defer r.Close()
	for {
		readCtx, cancel := context.WithTimeout(ctx, readIdleTimeout)
		m, err := r.ReadMessage(readCtx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("no message for %v below the high-water mark %d", readIdleTimeout, end)
			}
			return fmt.Errorf("inbox: reading %s/%d: %w", p.Topic, p.ID, err)
		}
		more, err := visit(p.ID, m)
		if err != nil {
			return err
		}
		if !more || m.Offset+1 >= end {
			return nil
		}
	}
}
