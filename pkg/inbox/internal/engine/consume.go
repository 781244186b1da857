// The dispatcher, a message's first stage: the consumer group and its
// partition readers, what may be committed and the commits, the routing of
// each message to its key's worker, and what comes with each message to an
// applier (Delivery).

package engine

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/internal/knob"
	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/internal/standby"
	"github.com/onceflow/onceflow/pkg/internal/writercheck"
)

// The defaults of GroupConfig's fields, which a zero field takes.
const (
	DefaultStartOffset       = kafka.FirstOffset
	DefaultSessionTimeout    = 10 * time.Second
	DefaultHeartbeatInterval = time.Second
	DefaultRebalanceTimeout  = 10 * time.Second
	DefaultCommitInterval    = 100 * time.Millisecond
	DefaultMaxWait           = 500 * time.Millisecond
	DefaultMinBytes          = 1
	DefaultMaxBytes          = 10 << 20
	DefaultQueueCapacity     = 100
	DefaultReadBackoffMin    = 10 * time.Millisecond
	DefaultReadBackoffMax    = 100 * time.Millisecond
	// DefaultDialTimeout is the dial timeout of the default Dialer.
	DefaultDialTimeout = 3 * time.Second
)

// GroupConfig names the topic a Consumer reads and the Kafka consumer group
// it reads it in. Zero fields take the documented defaults; negative ones
// are refused by Validate.
type GroupConfig struct {
	// Brokers are the bootstrap brokers. Required.
	Brokers []string
	// Topic is the topic to consume. Required.
	Topic string
	// Group is the consumer group id; every instance of a service uses the
	// same one and the group spreads the partitions among them. Required.
	Group string
	// StartOffset is where a partition the group never committed starts:
	// kafka.FirstOffset (the default) or kafka.LastOffset.
	StartOffset int64
	// SessionTimeout is how long the coordinator waits for a heartbeat
	// before it gives the member's partitions to others. Default
	// 10s.
	SessionTimeout time.Duration
	// HeartbeatInterval is how often the member heartbeats. Default
	// 1s.
	HeartbeatInterval time.Duration
	// RebalanceTimeout is how long the coordinator waits for every member
	// to rejoin in a rebalance. A member finishes the work in hand (up to
	// half of it) before it rejoins. Default 10s.
	RebalanceTimeout time.Duration
	// CommitInterval is how often finished offsets are committed. A crash
	// loses at most this much of offset commits, which are redelivered and
	// absorbed by the inbox. Default 100ms.
	CommitInterval time.Duration
	// MaxWait is the longest a partition's fetch waits at the broker for
	// MinBytes to arrive. A fetch returns as soon as MinBytes are there, so
	// with MinBytes 1 MaxWait costs a new message no latency: it only sets
	// how often an idle partition asks again — one fetch request per
	// partition per MaxWait, on the broker and here. Default
	// 500ms (50ms cost ~4× the idle CPU, for nothing).
	MaxWait time.Duration
	// MinBytes is how much a fetch waits for (up to MaxWait) before it
	// answers. Default 1: a message is handed over the moment it is
	// committed to the log. More batches fetches at high rates at the price
	// of up to MaxWait of latency at low ones.
	MinBytes int
	// MaxBytes bounds one fetch's answer per partition; a larger message
	// still comes through, alone. Default 10 MiB.
	MaxBytes int
	// QueueCapacity is how many fetched messages each partition's reader
	// holds ahead of the dispatcher. Default 100.
	QueueCapacity int
	// ReadBackoffMin and ReadBackoffMax bound the wait between fetches
	// that failed in a row (a broker error); a fetch that worked, empty or
	// not, is followed by the next at once. Defaults
	// 10ms and 100ms (kafka-go's own, 100ms and
	// 1s, slow down recovery after a leader change).
	ReadBackoffMin, ReadBackoffMax time.Duration
	// Dialer connects to the brokers, with TLS and SASL when it has them
	// (a dialer with the cluster's TLS and SASL). Default: plain TCP,
	// a 3s dial timeout.
	Dialer *kafka.Dialer
}

// WithDefaults returns g with every zero field set to its documented
// default; negative values are kept for Validate to refuse.
func (g GroupConfig) WithDefaults() GroupConfig {
	knob.Default(&g.StartOffset, DefaultStartOffset)
	knob.Default(&g.SessionTimeout, DefaultSessionTimeout)
	knob.Default(&g.HeartbeatInterval, DefaultHeartbeatInterval)
	knob.Default(&g.RebalanceTimeout, DefaultRebalanceTimeout)
	knob.Default(&g.CommitInterval, DefaultCommitInterval)
	knob.Default(&g.MaxWait, DefaultMaxWait)
	knob.Default(&g.MinBytes, DefaultMinBytes)
	knob.Default(&g.MaxBytes, DefaultMaxBytes)
	knob.Default(&g.QueueCapacity, DefaultQueueCapacity)
	knob.Default(&g.ReadBackoffMin, DefaultReadBackoffMin)
	knob.Default(&g.ReadBackoffMax, DefaultReadBackoffMax)
	if g.Dialer == nil {
		g.Dialer = &kafka.Dialer{Timeout: DefaultDialTimeout}
	}
	return g
}

// Validate reports a missing Brokers, Topic or Group, a negative duration
// or size, MinBytes above MaxBytes, ReadBackoffMin above ReadBackoffMax,
// an unknown StartOffset, or a HeartbeatInterval that does not fit in the
// SessionTimeout (the coordinator would evict the member between two
// heartbeats). It checks g as NewConsumer would use it, after WithDefaults.
func (g GroupConfig) Validate() error {
	if len(g.Brokers) == 0 || g.Topic == "" || g.Group == "" {
		return errors.New("inbox: GroupConfig needs Brokers, Topic and Group")
	}
	const name = "inbox: GroupConfig"
	if err := knob.RefuseNegative(name, g); err != nil {
		return err
	}
	if g.StartOffset != 0 && g.StartOffset != kafka.FirstOffset && g.StartOffset != kafka.LastOffset {
		return fmt.Errorf("inbox: GroupConfig.StartOffset is %d, neither kafka.FirstOffset nor kafka.LastOffset", g.StartOffset)
	}
	d := g.WithDefaults()
	if err := knob.RefuseCrossed(name, "MinBytes", d.MinBytes, "MaxBytes", d.MaxBytes); err != nil {
		return err
	}
	// kafka-go would panic on crossed read backoffs.
	if err := knob.RefuseCrossed(name, "ReadBackoffMin", d.ReadBackoffMin, "ReadBackoffMax", d.ReadBackoffMax); err != nil {
		return err
	}
	if d.HeartbeatInterval >= d.SessionTimeout {
		return fmt.Errorf("inbox: GroupConfig.HeartbeatInterval (%v) must be shorter than SessionTimeout (%v)", d.HeartbeatInterval, d.SessionTimeout)
	}
	return nil
}

// consume takes part in the consumer group until ctx ends, handing every
// fetched message to dispatch. Each generation gets one fetching goroutine
// per assigned partition and one committing goroutine, all started through
// the generation so kafka-go waits for them before joining the next one.
func (c *Consumer) consume(ctx context.Context, dispatch func(context.Context, fetched) bool) {
	gc := c.group
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                gc.Group,
		Brokers:           gc.Brokers,
		Dialer:            gc.Dialer,
		Topics:            []string{gc.Topic},
		StartOffset:       gc.StartOffset,
		SessionTimeout:    gc.SessionTimeout,
		HeartbeatInterval: gc.HeartbeatInterval,
		RebalanceTimeout:  gc.RebalanceTimeout,
		JoinGroupBackoff:  time.Second,
		// Partitions added to the topic rebalance the group.
		WatchPartitionChanges:  true,
		PartitionWatchInterval: 5 * time.Second,
		Timeout:                5 * time.Second,
	})
	if err != nil { // only an invalid config, which NewConsumer has checked
		c.cfg.Logger.ErrorContext(ctx, "inbox cannot create its consumer group", slog.String("consumer", c.cfg.Name), slog.Any("error", err))
		<-ctx.Done()
		return
	}
	// Run closes the workers' queues when consume returns: no fetcher may
	// be left to send on them, even one kafka-go started late.
	var fetchers sync.WaitGroup
	defer fetchers.Wait()
	defer c.closeGroup(group)
	for {
		gen, err := group.Next(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// kafka-go backs off between attempts to join; a rebalance in
			// progress is the group working, not the broker failing.
			if !errors.Is(err, kafka.RebalanceInProgress) {
				c.shared.kafka.Fail(ctx, "join", err)
			}
			continue
		}
		c.shared.kafka.OK(ctx, "join")
		assigned := map[partitionKey]int64{}
		for topic, parts := range gen.Assignments {
			for _, p := range parts {
				assigned[partitionKey{topic, p.ID}] = p.Offset
			}
		}
		g := newGeneration(gen.ID, assigned)
		c.cfg.Logger.InfoContext(ctx, "inbox joined a group generation", slog.String("consumer", c.cfg.Name),
			slog.Int("generation", int(gen.ID)), slog.Int("partitions", len(assigned)))
		for k, off := range assigned {
			fetchers.Add(1)
			gen.Start(func(gctx context.Context) {
				defer fetchers.Done()
				fctx, cancel := context.WithCancel(ctx)
				defer context.AfterFunc(gctx, cancel)()
				defer cancel()
				c.fetch(fctx, g, k, off, dispatch)
			})
		}
		gen.Start(func(gctx context.Context) { c.commitLoop(ctx, gctx, gen, g) })
		fetchers.Add(1) // it dispatches too
		gen.Start(func(gctx context.Context) {
			defer fetchers.Done()
			// At the start, and every LagInterval after it: an operator's
			// ReleaseHeld frees an aggregate without a message of it to
			// trigger the release.
			c.resumeReleases(gctx, g, assigned, dispatch)
			tick := time.NewTicker(c.cfg.LagInterval)
			defer tick.Stop()
			for {
				select {
				case <-gctx.Done(): // a function of the generation that returns ends it
					return
				case <-tick.C:
					c.resumeReleases(gctx, g, assigned, dispatch)
				}
			}
		})
	}
}

// closeGroup leaves the group, which first waits for the generation's
// goroutines (the last commit included), within the shutdown grace: a
// broker that is gone must not hold the process.
func (c *Consumer) closeGroup(group *kafka.ConsumerGroup) {
	done := make(chan struct{})
	go func() { _ = group.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(c.cfg.ShutdownGrace + time.Second):
		c.cfg.Logger.Warn("inbox gave up leaving its consumer group in time", slog.String("consumer", c.cfg.Name))
	}
}

// fetch reads one assigned partition from its assigned offset until ctx
// (the run's or the generation's) ends. A fetch error is the broker's: the
// reader is replaced, after a backoff, at the next offset.
func (c *Consumer) fetch(ctx context.Context, g *generation, k partitionKey, offset int64, dispatch func(context.Context, fetched) bool) {
	next := offset
	if next < 0 {
		next = c.group.StartOffset
	}
	for attempt := 1; ; attempt++ {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:         c.group.Brokers,
			Topic:           k.topic,
			Partition:       k.partition,
			Dialer:          c.group.Dialer,
			MinBytes:        c.group.MinBytes,
			MaxBytes:        c.group.MaxBytes,
			MaxWait:         c.group.MaxWait,
			QueueCapacity:   c.group.QueueCapacity,
			ReadBackoffMin:  c.group.ReadBackoffMin,
			ReadBackoffMax:  c.group.ReadBackoffMax,
			ReadLagInterval: -1,
			MaxAttempts:     3,
		})
		err := r.SetOffset(next)
		for err == nil {
			var m kafka.Message
			if m, err = r.FetchMessage(ctx); err != nil {
				break
			}
			attempt = 1
			next = m.Offset + 1
			c.shared.kafka.OK(ctx, "fetch")
			if !g.add(m) {
				continue
			}
			if !dispatch(ctx, fetched{m: m, gen: g}) {
				err = ctx.Err()
			}
		}
		_ = r.Close()
		if ctx.Err() != nil {
			return
		}
		c.shared.kafka.Fail(ctx, "fetch", fmt.Errorf("fetching %s/%d at %d: %w", k.topic, k.partition, next, err))
		if !retry.Sleep(ctx, retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)) {
			return
		}
	}
}

// commitLoop commits the generation's finished offsets every
// CommitInterval. When the generation ends (a rebalance, or ctx: shutdown)
// it lets the work in hand finish for a bounded time, commits once more and
// drops the generation's tracking; kafka-go joins the next generation only
// after that, so the next owner of a partition starts where this one stopped.
//
// With Config.CommitReplicated, a commit that finds the database on another
// server than the work was done on (a failover) ends the generation instead:
// see switched.
func (c *Consumer) commitLoop(ctx, gctx context.Context, gen *kafka.Generation, g *generation) {
	c.noteServer(ctx)
	tick := time.NewTicker(c.group.CommitInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			c.endGeneration(gen, g, c.cfg.ShutdownGrace)
			return
		case <-gctx.Done():
			c.endGeneration(gen, g, c.group.RebalanceTimeout/2)
			return
		case <-tick.C:
			if c.commit(ctx, gen, g) {
				c.endGeneration(gen, g, 0) // g is dropped: it commits nothing
				return                     // a function of the generation that returns ends it
			}
		}
	}
}

func (c *Consumer) endGeneration(gen *kafka.Generation, g *generation, grace time.Duration) {
	g.end()
	deadline := time.Now().Add(grace)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !g.drained() && time.Now().Before(deadline) {
		<-tick.C
	}
	// The coordinator takes commits of the generation being revoked until
	// the rebalance completes; after that it refuses them, which is safe.
	c.commit(context.Background(), gen, g)
	g.drop()
	c.cfg.Logger.Info("inbox left a group generation", slog.String("consumer", c.cfg.Name),
		slog.Int("generation", int(gen.ID)), slog.Bool("drained", g.drained()))
}

// commit commits the generation's finished offsets. It reports whether
// the database switched servers under them (CommitReplicated only): the
// generation is then dropped, uncommitted, and must end.
func (c *Consumer) commit(ctx context.Context, gen *kafka.Generation, g *generation) (switched bool) {
	offs := g.pending()
	if len(offs) == 0 {
		return false
	}
	if ok, switched := c.replicated(ctx, g); !ok {
		return switched // the offsets stay; the next tick tries again
	}
	err := gen.CommitOffsets(offs)
	switch {
	case err == nil:
		g.committed(offs)
		c.shared.kafka.OK(ctx, "commit")
	case errors.Is(err, kafka.RebalanceInProgress), errors.Is(err, kafka.IllegalGeneration),
		errors.Is(err, kafka.UnknownMemberId), errors.Is(err, kafka.FencedInstanceID):
		// The generation is over; the heartbeat ends it and the next owner
		// starts from the last offset committed.
	default:
		c.shared.kafka.Fail(ctx, "commit", err)
	}
	return false
}

// replicated reports whether offsets may be committed now: always, unless
// Config.CommitReplicated, in which case only once the standbys flushed
// everything the primary had flushed after the offsets were read, which
// covers the commits of every message they count (each committed, with
// synchronous_commit on, before it was finished). A wait bounded by
// CommitInterval that runs out, or a read that fails, is reported as the
// standbys' outage and the commit is left to a later tick. A reading from
// another server than the last one is a failover: see switched.
func (c *Consumer) replicated(ctx context.Context, g *generation) (ok, switched bool) {
	if c.shared.standby == nil {
		return true, false
	}
	p, err := standby.Await(ctx, c.shared.Pool, c.cfg.StandbySlots, c.group.CommitInterval)
	if p.Server != "" && c.serverIs(p.Server) != "" || errors.Is(err, standby.ErrSwitched) {
		c.switched(ctx, g, err)
		return false, true
	}
	if err != nil {
		if ctx.Err() == nil {
			c.shared.standby.Fail(ctx, "commit", err)
		}
		return false, false
	}
	c.shared.standby.OK(ctx, "commit")
	return true, false
}

// switched handles a failover under uncommitted work: the work behind the
// pending offsets was done on the old server, and with asynchronous
// replication its last commits died with it. Committing those offsets
// (once the promoted server has a standby of its own, the standby check
// passes) would skip for good the messages whose work was lost. So the
// generation is dropped, nothing of it committed, and ends; the member
// joins the next one, whose assignments start at the offsets committed
// before, and reads the messages again: what survived is a duplicate the
// inbox absorbs, what was lost is applied on the new server.
func (c *Consumer) switched(ctx context.Context, g *generation, cause error) {
	g.drop()
	c.serverMu.Lock()
	c.server = "" // the next generation records the new one
	c.serverMu.Unlock()
	ServerSwitches(c.cfg.Metrics).WithLabelValues(c.cfg.Name).Inc()
	c.cfg.Logger.WarnContext(ctx, "inbox's database is another server now (a failover): the offsets of the work done on the old one are not committed; rejoining the group to read again from the last committed offsets",
		slog.String("consumer", c.cfg.Name), slog.Any("cause", cause))
}

// noteServer records the server the work of a new generation is done on,
// if none was recorded (CommitReplicated only): a failover between the
// generation's first work and its first commit is then seen too.
func (c *Consumer) noteServer(ctx context.Context) {
	if c.shared.standby == nil {
		return
	}
	c.serverMu.Lock()
	known := c.server != ""
	c.serverMu.Unlock()
	if known {
		return
	}
	if p, err := standby.Read(ctx, c.shared.Pool, c.cfg.StandbySlots); err == nil {
		c.serverIs(p.Server)
	}
}

// serverIs records server as the one the work is done on and returns the
// one recorded before, if it was another ("" if it is the same or none
// was).
func (c *Consumer) serverIs(server string) (was string) {
	c.serverMu.Lock()
	defer c.serverMu.Unlock()
	if c.server != "" && c.server != server {
		was = c.server
	}
	c.server = server
	return was
}

// generation is one consumer-group generation as this member lives it: the
// partitions the group assigned to it and, per partition, the messages
// fetched and not yet committed. Tracking is per generation, so a message
// fetched again after a rebalance (kafka-go restarts from the committed
// offset) is a new entry of a new generation and never collides with the
// old one; and offsets are committed only with the generation's own id, so
// a member that lost a partition cannot move its committed offset back
// after the new owner went further (the coordinator refuses a commit of an
// older generation).
type generation struct {
	id int32
	// parent: a generation for messages released from the parking (see
	// released), dropped when its parent is.
	parent *generation

	mu       sync.Mutex
	ended    bool // no new work starts: the partitions may belong to another member now
	dropped  bool // tracking is gone: work still in hand is abandoned
	inflight int  // messages a worker began and has not finished
	parts    map[partitionKey]*partitionTrack
}

type partitionKey struct {
	topic     string
	partition int
}

// partitionTrack is one assigned partition within one generation.
type partitionTrack struct {
	queue []*tracked // in fetch order, which is offset order
	index map[int64]*tracked
	// fetched is one past the highest offset added: a partition reader never
	// goes back within a generation, and a message seen twice is ignored.
	fetched int64
	// commit is the offset to commit (Kafka's next-offset semantics: one
	// past the last message done with every message before it), -1 until a
	// message is done; committed is the last offset the coordinator took.
	commit, committed int64
}

type tracked struct {
	offset int64
	done   bool
}

// newGeneration tracks the partitions assigned in generation id, each
// starting at its assigned offset (negative: no committed offset yet).
func newGeneration(id int32, assigned map[partitionKey]int64) *generation {
	g := &generation{id: id, parts: make(map[partitionKey]*partitionTrack, len(assigned))}
	for k, off := range assigned {
		p := &partitionTrack{index: map[int64]*tracked{}, fetched: -1, commit: -1, committed: -1}
		if off >= 0 {
			p.fetched, p.commit, p.committed = off, off, off
		}
		g.parts[k] = p
	}
	return g
}

// add tracks m, fetched in this generation. It returns false, and m must not
// be handled under this generation, when the generation has ended, m's
// partition is not assigned in it, or m was fetched already.
func (g *generation) add(m kafka.Message) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.parts[partitionKey{m.Topic, m.Partition}]
	if g.ended || p == nil || m.Offset < p.fetched {
		return false
	}
	t := &tracked{offset: m.Offset}
	p.queue = append(p.queue, t)
	p.index[m.Offset] = t
	p.fetched = m.Offset + 1
	return true
}

// begin is called by a worker before it handles m. False means the
// generation has ended: m is left to whoever owns its partition now, which
// fetches it again from the committed offset.
func (g *generation) begin() bool {
	if g == nil { // handed in through Handle: nothing to track
		return true
	}
	if g.parent != nil && !g.parent.live() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return false
	}
	g.inflight++
	return true
}

// Finish is called once for every begin. ok says m's work committed (or was
// settled without work); only then may the offset pass it. A message
// abandoned (ok false) holds its partition's offset back, and it is fetched
// again in a later generation.
func (g *generation) Finish(m kafka.Message, ok bool) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	if !ok || g.dropped {
		return
	}
	p := g.parts[partitionKey{m.Topic, m.Partition}]
	if p == nil || p.index[m.Offset] == nil {
		return
	}
	p.index[m.Offset].done = true
	for len(p.queue) > 0 && p.queue[0].done {
		p.commit = p.queue[0].offset + 1
		delete(p.index, p.queue[0].offset)
		p.queue = p.queue[1:]
	}
}

// pending returns the offsets to commit: each partition whose commit offset
// moved past the last one committed. Nothing once the generation is dropped.
func (g *generation) pending() map[string]map[int]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dropped {
		return nil
	}
	var out map[string]map[int]int64
	for k, p := range g.parts {
		if p.commit <= p.committed {
			continue
		}
		if out == nil {
			out = map[string]map[int]int64{}
		}
		if out[k.topic] == nil {
			out[k.topic] = map[int]int64{}
		}
		out[k.topic][k.partition] = p.commit
	}
	return out
}

// committed records that the coordinator took offs.
func (g *generation) committed(offs map[string]map[int]int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for topic, parts := range offs {
		for partition, off := range parts {
			if p := g.parts[partitionKey{topic, partition}]; p != nil && off > p.committed {
				p.committed = off
			}
		}
	}
}

// end stops new work from starting under the generation.
func (g *generation) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ended = true
}

// live reports whether work may still start under g.
func (g *generation) live() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.ended
}

// drained reports whether no worker is handling a message of the generation.
func (g *generation) drained() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inflight == 0
}

// drop forgets the generation's tracking: nothing more is committed for it,
// and workers still handling its messages abandon them at their next wait.
func (g *generation) drop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ended, g.dropped = true, true
	g.parts = nil
}

// IsDropped reports whether drop was called (on its parent, for released).
func (g *generation) IsDropped() bool {
	if g.parent != nil {
		return g.parent.IsDropped()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dropped
}

// released is the generation of a message released from the parking
// (settle.go), handled under g: abandoned when g is dropped, but tracking no
// offset, since it was not fetched in g (its own offset was committed when
// it was parked).
func (g *generation) released() *generation {
	if g == nil {
		return nil
	}
	return &generation{id: g.id, parent: g}
}

// Consumer handles the messages of one topic, in one consumer group,
// through the inbox. It is the dispatcher: it takes part in the group
// (the group), tracks what may be committed (the offsets), hands each
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
// workers: TxApplier (apply.go) or pkg/inbox/lease's. It gets what
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

// Delivery is one message in an applier's hands, with the generation it was
// fetched in, as the applier sees it.
type Delivery struct {
	Msg kafka.Message
	Gen Tracker
}

// Tracker is what an applier may do with the generation a message was
// fetched in, which the dispatcher keeps (its offsets): finish the message,
// once, and ask whether the generation was dropped meanwhile.
type Tracker interface {
	// Finish says the applier is done with m. ok says m's work committed
	// (or it was settled without work), so its offset may be committed; a
	// message finished not ok holds its partition's offset back and is
	// fetched again in a later generation.
	Finish(m kafka.Message, ok bool)
	// IsDropped reports whether the generation was dropped (a rebalance gave
	// its partitions away): the work in hand is abandoned at its next wait.
	IsDropped() bool
}

// Outcome is what became of one message.
type Outcome int

const (
	Processed Outcome = iota
	Duplicate
	Stale
	DeadLettered
	ParkedOutcome // held behind a dead message of its aggregate (settle.go)

	NumOutcomes = iota
)

// Wait sleeps for d, or returns errAbandoned when ctx ends (the shutdown
// grace is over) or the message's generation is dropped first.
func Wait(ctx context.Context, gen Tracker, d time.Duration) error {
	if !retry.Sleep(ctx, d) || (gen != nil && gen.IsDropped()) {
		return ErrAbandoned
	}
	return nil
}
