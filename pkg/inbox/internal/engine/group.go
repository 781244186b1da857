package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/internal/knob"
	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/internal/standby"
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
