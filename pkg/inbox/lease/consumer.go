package lease

import (
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// NewConsumer returns a consumer that runs eff for each event in lease mode
// (see Effect). Dedupe, the version guard, upcasters, dead letters, workers
// and offsets work as in inbox.NewConsumer, whose dispatcher it shares
// (pkg/inbox/internal/engine); only the applier differs. Each worker leases
// a batch of messages in one transaction, calls out for them — distinct
// keys concurrently, up to Config.MaxInFlight calls at once, each key's
// messages in order — and marks them done in one transaction.
func NewConsumer(pool *pgxpool.Pool, src inbox.GroupConfig, dlq inbox.Writer, eff Effect, cfg Config) (*inbox.Consumer, error) {
	if eff.Check == nil || eff.Call == nil {
		return nil, errors.New("inbox: an Effect needs Check and Call")
	}
	if eff.Done != nil && eff.DoneBatch != nil {
		return nil, errors.New("inbox: an Effect has Done or DoneBatch, not both")
	}
	if pool == nil || dlq == nil {
		return nil, errors.New("inbox: lease.NewConsumer needs a pool and a dead-letter writer")
	}
	if err := src.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	return engine.NewApplied(pool, src.WithDefaults(), dlq, cfg.Config, func(s *engine.Shared) engine.Applier {
		return newApplier(s, eff, cfg)
	})
}
