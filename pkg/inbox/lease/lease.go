package lease

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"

	"context"
	"errors"
	"log/slog"

	"github.com/onceflow/onceflow/pkg/event"
)

// applier is the lease applier, NewConsumer's, for side effects
// outside the database (see Effect): a batch's messages are leased in one
// transaction (lease_claim.go), their effects run under the leases, each
// key's in order and distinct keys side by side (lease_batch.go,
// lease_call.go), and the called ones are marked done in one transaction; a
// message the batch cannot lease is settled alone (lease_alone.go), and a
// lease that cannot close with its batch closes on its own (lease_settle.go).
type applier struct {
	*engine.Shared
	leaseCfg Config // its inbox.Config is Shared.Config
	effect   Effect
	calls    chan struct{} // a slot per side-effect call in flight (MaxInFlight)
	other    *engine.Fault // the Effect's other side (a third party)
}

// newApplier returns the lease applier of eff, on s, with cfg (with its
// defaults; its inbox.Config is s.Config).
func newApplier(s *engine.Shared, eff Effect, cfg Config) *applier {
	s.ReservesVersions = true
	m := s.Config.Metrics
	a := &applier{Shared: s, leaseCfg: cfg, effect: eff, calls: make(chan struct{}, cfg.MaxInFlight),
		other: engine.NewFault("the third party", s.Config.Name, s.Config.Logger, s.Config.ErrorLogInterval, engine.EffectErrors(m), engine.EffectConnected(m))}
	for _, op := range []string{opCheck, opCall} {
		engine.EffectErrors(m).WithLabelValues(s.Config.Name, op)
	}
	return a
}

// The reads of the lease applier; its writes are transitions (pkg/inbox/internal/state),
// each naming the fencing token it expects, so a worker whose lease was
// taken over changes nothing.
const (
	// leaseState reads what keeps a message from being leased.
	leaseState = `SELECT status, lease_until FROM inbox_messages WHERE consumer = $1 AND message_id = $2`

	// leaseStates is leaseState for a batch.
	leaseStates = `
SELECT message_id, status, lease_until FROM inbox_messages WHERE consumer = $1 AND message_id = ANY($2)`
)

// errLeaseLost says a lease this worker took was taken over (it expired and
// another worker leased the message): the new holder settles the message.
var errLeaseLost = errors.New("the lease was taken over")

// leaseTakenOver logs that a lease of this worker went to another one.
func (a *applier) leaseTakenOver(ctx context.Context, ev event.Envelope) {
	a.Config.Logger.WarnContext(ctx, "inbox lease was taken over; leaving the row to the new holder",
		slog.String("consumer", a.Config.Name), slog.String("event_id", ev.EventID.String()))
}
