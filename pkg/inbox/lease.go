package inbox

import (
	"context"
	"errors"
	"log/slog"

	"github.com/onceflow/onceflow/pkg/event"
)

// leaseApplier is the lease applier, NewLeaseConsumer's, for side effects
// outside the database (see Effect): a batch's messages are leased in one
// transaction (lease_claim.go), their effects run under the leases, each
// key's in order and distinct keys side by side (lease_batch.go,
// lease_call.go), and the called ones are marked done in one transaction; a
// message the batch cannot lease is settled alone (lease_alone.go), and a
// lease that cannot close with its batch closes on its own (lease_settle.go).
type leaseApplier struct {
	*shared
	leaseCfg LeaseConfig // its Config is shared.cfg
	effect   Effect
	calls    chan struct{} // a slot per side-effect call in flight (MaxInFlight)
	other    *fault        // the Effect's other side (a third party)
}

// newLeaseApplier returns the lease applier of eff, on s, with cfg (with its
// defaults; its Config is s.cfg).
func newLeaseApplier(s *shared, eff Effect, cfg LeaseConfig) *leaseApplier {
	s.reservesVersions = true
	m := s.cfg.Metrics
	a := &leaseApplier{shared: s, leaseCfg: cfg, effect: eff, calls: make(chan struct{}, cfg.MaxInFlight),
		other: newFault("the third party", s.cfg.Name, s.cfg.Logger, s.cfg.ErrorLogInterval, m.effectErrors, m.effectConnected)}
	for _, op := range []string{opCheck, opCall} {
		m.effectErrors.WithLabelValues(s.cfg.Name, op)
	}
	return a
}

// The SQL of the lease applier. Each statement names the fencing token it
// expects, so a worker whose lease was taken over changes nothing.
const (
	// claimLease takes the message's inbox row: a new row, or an expired
	// lease of a worker that died. It returns the fencing token and whether
	// an earlier lease existed (so the side effect may have happened).
	claimLease = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash,
                            lease_owner, lease_until, fencing_token)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'leased', sha256($9), $10, now() + $11 * interval '1 microsecond', 1)
ON CONFLICT (consumer, message_id) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until,
    fencing_token = inbox_messages.fencing_token + 1, attempts = inbox_messages.attempts + 1
WHERE inbox_messages.status = 'leased' AND inbox_messages.lease_until < now()
RETURNING fencing_token, fencing_token > 1`

	// claimLeases is claimLease for a batch of distinct event ids, in id
	// order so two consumers claiming overlapping batches lock rows in the
	// same order. Ids it does not return are settled already or leased to
	// a live worker (leaseStates tells which).
	claimLeases = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash,
                            lease_owner, lease_until, fencing_token)
SELECT $1, m.id, m.event_type, m.aggregate_id, m.aggregate_version, m.topic, m.kafka_partition,
       m.kafka_offset, 'leased', sha256(m.payload), $10, now() + $11 * interval '1 microsecond', 1
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::int[], $8::bigint[], $9::bytea[])
     AS m(id, event_type, aggregate_id, aggregate_version, topic, kafka_partition, kafka_offset, payload)
ORDER BY m.id
ON CONFLICT (consumer, message_id) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until,
    fencing_token = inbox_messages.fencing_token + 1, attempts = inbox_messages.attempts + 1
WHERE inbox_messages.status = 'leased' AND inbox_messages.lease_until < now()
RETURNING message_id, fencing_token, fencing_token > 1`

	// leaseState reads what keeps a message from being leased.
	leaseState = `SELECT status, lease_until FROM inbox_messages WHERE consumer = $1 AND message_id = $2`

	// leaseStates is leaseState for a batch.
	leaseStates = `
SELECT message_id, status, lease_until FROM inbox_messages WHERE consumer = $1 AND message_id = ANY($2)`

	// renewLease keeps a lease while its holder retries or waits its turn.
	renewLease = `
UPDATE inbox_messages SET lease_until = now() + $4 * interval '1 microsecond'
WHERE consumer = $1 AND message_id = $2 AND fencing_token = $3 AND status = 'leased'`

	// markLeaseDone closes one lease as processed.
	markLeaseDone = `
UPDATE inbox_messages SET status = 'processed', processed_at = now(), lease_owner = NULL, lease_until = NULL
WHERE consumer = $1 AND message_id = $2 AND status = 'leased' AND fencing_token = $3`

	// markLeasesDone closes a batch of leases as processed and returns the
	// ones that were still this worker's.
	markLeasesDone = `
UPDATE inbox_messages i SET status = 'processed', processed_at = now(), lease_owner = NULL, lease_until = NULL
FROM unnest($2::uuid[], $3::bigint[]) AS m(id, token)
WHERE i.consumer = $1 AND i.message_id = m.id AND i.status = 'leased' AND i.fencing_token = m.token
RETURNING i.message_id`

	// markLeaseUncertain records a side effect nobody can vouch for.
	markLeaseUncertain = `
UPDATE inbox_messages SET status = 'uncertain', last_error = $4, lease_owner = NULL, lease_until = NULL
WHERE consumer = $1 AND message_id = $2 AND fencing_token = $3`
)

// deleteLease removes the inbox row of a message leased with its batch, if
// the lease is still this worker's, to park the message instead.
const deleteLease = `DELETE FROM inbox_messages WHERE consumer = $1 AND message_id = $2 AND status = 'leased' AND fencing_token = $3`

// errLeaseLost says a lease this worker took was taken over (it expired and
// another worker leased the message): the new holder settles the message.
var errLeaseLost = errors.New("the lease was taken over")

// leaseTakenOver logs that a lease of this worker went to another one.
func (a *leaseApplier) leaseTakenOver(ctx context.Context, ev event.Envelope) {
	a.cfg.Logger.WarnContext(ctx, "inbox lease was taken over; leaving the row to the new holder",
		slog.String("consumer", a.cfg.Name), slog.String("event_id", ev.EventID.String()))
}
