// Package outboxrelay starts the outbox relay of a service (platform/service)
// in the mode its configuration names: poll, or the log-based relay of
// pkg/outbox/cdc. It is a package of its own so that a service without an
// outbox (the reconciler shim) links no replication client
// (TestServicesLinkNoTestTooling checks it).
package outboxrelay

import (
	"context"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/platform/lifecycle"
	"github.com/onceflow/onceflow/platform/service"
)

// Stage builds the outbox relay every service with an outbox runs: a
// publisher as cfg says (its Logger defaults to the service's), writing to
// w, on a pool of its own (Service.OwnPool, service.RelayPoolConns): in the pool the API's
// requests and a consumer's transactions share, each claim would wait for
// a connection first. It prepares the relay (cdc.Publisher.Prepare: in
// RELAY_MODE=wal, the slot exists before anything is emitted) and returns
// its stage for Run.
func Stage(ctx context.Context, s *service.Service, w outbox.Writer, cfg cdc.PublisherConfig) (lifecycle.Stage, error) {
	pool, err := s.OwnPool(ctx, service.RelayPoolConns)
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
