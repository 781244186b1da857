// Package standby makes a relay publish only what the standbys have: both
// relays (package outbox's polling relay, package outbox/cdc's log-based
// one) wait at a Gate before they publish.
package standby

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/standby"
	"github.com/onceflow/onceflow/pkg/outbox/internal/metrics"
	"github.com/onceflow/onceflow/pkg/outbox/internal/outage"
)

// Publishing only what the standby has (issue 32): a commit is visible on
// the primary, and decoded by a logical walsender, before a standby holds
// it — with asynchronous replication always, with synchronous replication
// while the commit waits for the standby (a waiting commit whose client
// gives up becomes visible at once). A relay that publishes it then
// publishes an event a failover to that standby takes back: the order is
// gone, its charge at the third party is not. Config.PublishReplicated
// makes a relay wait until every standby the failover could promote has
// flushed the commits it is about to publish. PostgreSQL 17's
// synchronized_standby_slots does the same for logical decoding (the
// walsender waits); this works on 15 too, and for the polling relay.

// DefaultWait bounds one wait for the standbys: past it the batch
// (polling relay) or the stream (log-based relay) is abandoned and retried,
// and the relay reports a standby outage. Nothing is charged to a row.
const DefaultWait = 5 * time.Second

// Config is outbox.Standby, whose fields are documented there; the relays
// convert theirs to it.
type Config struct {
	PublishReplicated bool
	StandbySlots      []string
	ReplicatedWait    time.Duration
}

// ErrBehind is what a wait that ran out of ReplicatedWait returns:
// an outage the relay waits out, never the message's fault.
var ErrBehind = errors.New("outbox: the standbys have not flushed the commits to publish")

// LSN is a position in the WAL.
type LSN = standby.LSN

// Querier is what the waits query: a pooled connection, a transaction or
// the pool itself.
type Querier = standby.Querier

// Gate waits for the standbys on behalf of one relay.
type Gate struct {
	cfg     Config
	metrics *metrics.Standby
	health  *outage.Outage
	logger  *slog.Logger
}

// NewGate returns the gate of cfg, nil (a gate that never waits) unless
// cfg.PublishReplicated.
func NewGate(cfg Config, m *metrics.Metrics, logger *slog.Logger, logInterval time.Duration) *Gate {
	if !cfg.PublishReplicated {
		return nil
	}
	if cfg.ReplicatedWait == 0 {
		cfg.ReplicatedWait = DefaultWait
	}
	if cfg.StandbySlots == nil {
		cfg.StandbySlots = []string{}
	}
	return &Gate{cfg: cfg, metrics: m.Standby, logger: logger,
		health: outage.New("waiting for the standbys to flush what is to be published", logger, logInterval)}
}

// Await waits until the standbys flushed everything the primary had
// flushed when it was called, reading both through q, at most
// ReplicatedWait. The polling relay calls it after its claim, in the claim's
// transaction: every row it claimed committed below that position
// (pg_current_wal_flush_lsn() bounds every commit a query on the primary
// can see: a commit made with synchronous_commit on is flushed before it is
// visible).
func (g *Gate) Await(ctx context.Context, q Querier) error {
	if g == nil {
		return nil
	}
	began := time.Now()
	p, err := standby.Read(ctx, q, g.cfg.StandbySlots)
	if err != nil {
		return err
	}
	_, err = g.wait(ctx, q, p.Primary, began, p)
	return err
}

// AwaitCommit is Await for the log-based relay, called when a
// transaction's begin arrives: it waits until the standbys flushed up to
// walEnd, the server's WAL end the walsender sent with the begin (its
// XLogData's ServerWALEnd), not for everything the primary flushed since a
// query of its own. The walsender sent the begin only once it had decoded
// the transaction's commit, so the whole commit record lies below walEnd.
// The begin message's final LSN would be nearer, but it is where the
// commit record starts: a standby whose flush stopped inside that record
// (a record split across WAL pages) would not have the commit, and a
// failover to it would take back an event consumers saw.
//
// *seen is the standbys' position the caller last read: a transaction
// whose walEnd is below it passes without a query, so a stream that is not
// far ahead of its standbys reads them about once per batch of
// transactions rather than once per transaction. The caller keeps *seen
// for one stream only: a standby replaced meanwhile (its slot recreated)
// may be behind it.
func (g *Gate) AwaitCommit(ctx context.Context, q Querier, walEnd LSN, seen *LSN) error {
	if g == nil {
		return nil
	}
	began := time.Now()
	if *seen >= walEnd {
		g.passed(ctx, "at_once", began)
		return nil
	}
	p, err := standby.Read(ctx, q, g.cfg.StandbySlots)
	if err != nil {
		return err
	}
	at, err := g.wait(ctx, q, walEnd, began, p)
	*seen = max(*seen, at)
	return err
}

// wait waits, from the first reading p, until the standbys reach target
// or ReplicatedWait from began runs out. It returns the last position read
// (0 for none).
func (g *Gate) wait(ctx context.Context, q Querier, target LSN, began time.Time, p standby.Position) (LSN, error) {
	if p.Has(target) {
		g.passed(ctx, "at_once", began)
		return p.Standby, nil
	}
	p, err := standby.Until(ctx, q, g.cfg.StandbySlots, target, p.Server, began.Add(g.cfg.ReplicatedWait))
	switch {
	case err == nil:
		g.passed(ctx, "waited", began)
	case errors.Is(err, standby.ErrBehind):
		g.metrics.Waits.WithLabelValues("timeout").Inc()
		g.metrics.Behind.Set(1)
		err = fmt.Errorf("%w within %v (%w)", ErrBehind, g.cfg.ReplicatedWait, err)
		g.health.Fail(ctx, err)
	}
	if p.Slots == 0 {
		return 0, err
	}
	return p.Standby, err
}

func (g *Gate) passed(ctx context.Context, outcome string, began time.Time) {
	g.metrics.Waits.WithLabelValues(outcome).Inc()
	g.metrics.Waited.Observe(time.Since(began).Seconds())
	g.metrics.Behind.Set(0)
	g.health.OK(ctx)
}

// Validate refuses a negative ReplicatedWait, which RefuseNegative does not
// see inside the nested struct.
func (s Config) Validate(config string) error {
	if s.ReplicatedWait < 0 {
		return fmt.Errorf("%s.Standby.ReplicatedWait is negative (%v); leave it zero for the default", config, s.ReplicatedWait)
	}
	return nil
}
