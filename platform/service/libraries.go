package service

import (
	"context"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/platform/inboxhttp"
	"github.com/onceflow/onceflow/platform/lifecycle"
	"github.com/onceflow/onceflow/platform/outboxhttp"
)

// OutboxRelay builds the outbox relay every service with an outbox runs: a
// publisher as cfg says (its Logger defaults to the service's), writing to
// w, on a pool of its own (OwnPool, RelayPoolConns): in the pool the API's
// requests and a consumer's transactions share, each claim would wait for
// a connection first. It prepares the relay (cdc.Publisher.Prepare: in
// RELAY_MODE=wal, the slot exists before anything is emitted) and returns
// its stage for Run.
func (s *Service) OutboxRelay(ctx context.Context, w outbox.Writer, cfg cdc.PublisherConfig) (lifecycle.Stage, error) {
	pool, err := s.OwnPool(ctx, RelayPoolConns)
	if err != nil {
		return lifecycle.Stage{}, err
	}
	if cfg.Logger == nil {
		cfg.Logger = s.Logger
	}
	relay, err := cdc.NewPublisher(pool, w, cfg)
	if err != nil {
		return lifecycle.Stage{}, err
	}
	// Before the service takes writes: in RELAY_MODE=wal an event emitted
	// before the relay's slot exists would be kept by nothing.
	if err := relay.Prepare(ctx); err != nil {
		return lifecycle.Stage{}, err
	}
	// And after a failover, until the relay holds a slot on the promoted
	// server again (Emit refuses meanwhile): not ready, so that a load
	// balancer sends the writes elsewhere or waits.
	if logBased, ok := relay.(*cdc.Relay); ok && cfg.Mode == outbox.ModeWAL {
		s.AddCheck("replication slot", logBased.SlotReady)
	}
	return lifecycle.Stage{Name: "outbox relay (" + string(cfg.Mode) + ")", Run: relay.Run}, nil
}

// OutboxOperations is what every service with an outbox runs beside its
// relay: the operator routes under /admin/outbox (list, requeue, replay;
// see outboxhttp) for the relay's mode, and the outbox pruner, which prune
// configures. It returns the pruner's stage for Run.
func (s *Service) OutboxOperations(mode outbox.RelayMode, prune outbox.PruneConfig) (lifecycle.Stage, error) {
	pruner, err := outbox.NewPruner(s.Pool, outbox.PrunerConfig{PruneConfig: prune, Logger: s.Logger})
	if err != nil {
		return lifecycle.Stage{}, err
	}
	s.Mount("/admin/outbox", outboxhttp.Handler(s.Pool, mode, s.Logger))
	return lifecycle.Stage{Name: "outbox pruner", Run: pruner.Run}, nil
}

// InboxOperations is what every service with an inbox runs beside its
// consumer: the operator routes under /admin/inbox (list and requeue dead
// letters; see inboxhttp) for topic, whose dead letters are in topic+".dlt"
// and are requeued through w, and the inbox pruner at its defaults. It
// returns the pruner's stage for Run.
func (s *Service) InboxOperations(w inboxadmin.Writer, topic string) (lifecycle.Stage, error) {
	pruner, err := inbox.NewPruner(s.Pool, inbox.PrunerConfig{Logger: s.Logger})
	if err != nil {
		return lifecycle.Stage{}, err
	}
	s.Mount("/admin/inbox", inboxhttp.Handler(s.Pool, w, s.opts.KafkaBrokers, map[string]string{topic: topic + ".dlt"},
		s.Logger, inboxadmin.WithDialer(s.opts.Kafka.Dialer())))
	return lifecycle.Stage{Name: "inbox pruner", Run: pruner.Run}, nil
}
