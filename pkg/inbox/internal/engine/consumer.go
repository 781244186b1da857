package engine

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/internal/writercheck"
)

// Consumer handles the messages of one topic, in one consumer group,
// through the inbox. It is the dispatcher: it takes part in the group
// (group.go), tracks what may be committed (offsets.go), hands each
// message to the worker its key hashes to and each worker's batches to its
// applier, the engine its constructor picked (NewConsumer's TxApplier, or
// pkg/inbox/lease's, through NewApplied).
type Consumer struct {
	group   GroupConfig
	cfg     Config
	shared  *Shared // the pool, the outages, the parked aggregates to release
	applier Applier
	// server is the database server the consumer's uncommitted work was
	// done on, as the last reading of Config.CommitReplicated saw it
	// (standby.Position.Server); "" before the first.
	serverMu sync.Mutex
	server   string
}

// Applier is an engine that settles the batches of the dispatcher's
// workers: TxApplier (txapply.go) or pkg/inbox/lease's. It gets what
// it needs from the dispatcher when it is built (shared) and with each
// message (delivery), and never calls back into the dispatcher.
type Applier interface {
	// Process settles batch, a worker's messages in the order they were
	// fetched; every message is finished (done or abandoned) when it
	// returns. It returns an error when ctx ended first (the shutdown
	// grace) or a crash point fired (a *CrashError).
	Process(ctx context.Context, batch []Delivery) error
	// Health describes an outage of what the applier calls besides the
	// database (the lease applier's third party), nil when there is none.
	Health() error
}

// NewConsumer returns a consumer that reads src's topic as a member of its
// consumer group, handles each event with h in a transaction on pool, and
// dead-letters through dlq.
func NewConsumer(pool *pgxpool.Pool, src GroupConfig, dlq Writer, h Handler, cfg Config) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("inbox: NewConsumer needs a pool, a dead-letter writer and a handler")
	}
	return newTxConsumer(pool, src, dlq, &TxApplier{handle: h}, cfg)
}

// NewBatchConsumer is NewConsumer with a handler that also applies the new
// events of a batch at once (BatchHandler.HandleBatch), in the batch's
// transaction, so that what it writes for them takes a statement or two
// instead of a few per event. Messages settled on their own (a batch that
// failed, a retry) go through its Handle.
func NewBatchConsumer(pool *pgxpool.Pool, src GroupConfig, dlq Writer, h BatchHandler, cfg Config) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("inbox: NewBatchConsumer needs a pool, a dead-letter writer and a handler")
	}
	return newTxConsumer(pool, src, dlq, &TxApplier{handle: h.Handle, handleBatch: h.HandleBatch}, cfg)
}

// newTxConsumer is NewConsumer and NewBatchConsumer with the applier they
// built, short of what the consumer shares with it.
func newTxConsumer(pool *pgxpool.Pool, src GroupConfig, dlq Writer, a *TxApplier, cfg Config) (*Consumer, error) {
	if pool == nil || dlq == nil {
		return nil, errors.New("inbox: a consumer needs a pool, a dead-letter writer and a handler")
	}
	if err := src.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c, s, err := newConsumer(pool, src.WithDefaults(), dlq, cfg.WithDefaults())
	if err != nil {
		return nil, err
	}
	a.Shared = s
	c.applier = a
	return c, nil
}

// NewApplied is the dispatcher with an applier that another package builds
// on what it shares with the dispatcher: pkg/inbox/lease's lease applier.
// src and cfg are checked and have their defaults.
func NewApplied(pool *pgxpool.Pool, src GroupConfig, dlq Writer, cfg Config, build func(*Shared) Applier) (*Consumer, error) {
	c, s, err := newConsumer(pool, src, dlq, cfg)
	if err != nil {
		return nil, err
	}
	c.applier = build(s)
	return c, nil
}

// ApplierOf returns c's applier, for the tests of another package that
// drive an applier's steps one by one (pkg/inbox/lease's interleavings).
func ApplierOf(c *Consumer) Applier { return c.applier }

// newConsumer is the dispatcher of both constructors, and what it shares
// with their appliers; src and cfg are checked and have their defaults.
func newConsumer(pool *pgxpool.Pool, src GroupConfig, dlq Writer, cfg Config) (*Consumer, *Shared, error) {
	// Dead letters keep their key but need no particular hash: nobody reads
	// a dead-letter topic in per-key order.
	if err := writercheck.Check(dlq, false, "inbox: the dead-letter writer"); err != nil {
		return nil, nil, err
	}
	s, err := newShared(pool, dlq, cfg)
	if err != nil {
		return nil, nil, err
	}
	return &Consumer{group: src, cfg: cfg, shared: s}, s, nil
}

// Run consumes until ctx ends. Broker and database outages are waited out
// (see doc.go for how errors are classified); Run returns only after ctx
// ended, with nil, or when a crash point fires, or at once when the
// dead-letter topic does not exist (it is refused at start, not found
// missing at the first message that needs it). On the way out, the work in
// hand gets ShutdownGrace to finish and have its offsets committed; what is
// still unfinished then is abandoned and redelivered later.
func (c *Consumer) Run(ctx context.Context) error {
	if err := c.requireDeadLetterTopic(ctx); err != nil {
		return err
	}
	// The work in hand outlives ctx by ShutdownGrace at most.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownGrace, cancelWork) })
	defer stopGrace()
	// A crash point stops the whole consumer: fetching and the other workers.
	ctx, stop := context.WithCancel(ctx)
	defer stop()

	queues := make([]chan fetched, c.cfg.Workers)
	crashed := make(chan error, c.cfg.Workers)
	var workers, side sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan fetched, c.cfg.BatchSize)
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

	c.consume(ctx, func(ctx context.Context, d fetched) bool {
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
// dead-letter writer; in lease mode, through the batch's lease, the Effect
// and the batch's marking done —
// but commits no offset, since msgs did not come from the consumer group.
// It is for callers that fetch messages themselves (a replay from a file,
// a test: inboxtest.Deliver runs handlers through it without Kafka).
//
// It returns nil once every message is settled (handled, skipped as a
// duplicate or stale, or dead-lettered), or an error when ctx ended first
// or a crash point fired.
func (c *Consumer) Handle(ctx context.Context, msgs ...kafka.Message) error {
	batch := make([]fetched, len(msgs))
	for i, m := range msgs {
		batch[i] = fetched{m: m}
	}
	if err := c.applier.Process(ctx, deliveries(batch)); err != nil {
		return err
	}
	if err := c.releaseParked(ctx, batch); err != nil {
		return err
	}
	return ctx.Err()
}

// fetched is a message on its way to a worker, with the generation it was
// fetched in (or released under, see generation.released); nil when it came
// through Handle.
type fetched struct {
	m   kafka.Message
	gen *generation
}

// deliveries hands batch to the applier: each message with its generation,
// or with nothing to track when it came through Handle.
func deliveries(batch []fetched) []Delivery {
	out := make([]Delivery, len(batch))
	for i, f := range batch {
		out[i] = Delivery{Msg: f.m, Gen: Untracked{}}
		if f.gen != nil {
			out[i].Gen = f.gen
		}
	}
	return out
}

// Untracked is the generation of a message handed in through Handle: it
// commits no offset and is never dropped.
type Untracked struct{}

func (Untracked) Finish(kafka.Message, bool) {}

func (Untracked) IsDropped() bool { return false }

func workerFor(key []byte, n int) int {
	h := fnv.New32a()
	_, _ = h.Write(key)
	return int(h.Sum32() % uint32(n))
}

// worker handles its queue in batches until the queue closes. Messages of a
// generation that ended are skipped: their partition's next owner fetches
// them again from the committed offset. It returns only a crash.
func (c *Consumer) worker(ctx context.Context, q <-chan fetched) error {
	for d := range q {
		if ctx.Err() != nil || !d.gen.begin() {
			continue
		}
		batch := []fetched{d}
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
		err := c.applier.Process(ctx, deliveries(batch))
		if err == nil {
			// A requeued dead message applied in the batch lets its
			// aggregate's parked messages go, in this worker, which
			// handles every message of the aggregate's key.
			err = c.releaseParked(ctx, batch)
		}
		var crash *CrashError
		if errors.As(err, &crash) {
			return err
		}
	}
	return nil
}

// Healthy reports what keeps the consumer from working right now: Kafka or
// the database unreachable, or in lease mode the Effect's other side (the
// last error says why), or nil. The consumer
// waits outages out by itself; a service's /readyz reports this so the
// broken part is visible, and its metrics (inbox_kafka_connected,
// inbox_database_connected) show it over time.
func (c *Consumer) Healthy() error {
	return errors.Join(c.shared.kafka.Err(), c.shared.DB.Err(), c.applier.Health())
}
