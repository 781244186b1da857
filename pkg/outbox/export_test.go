package outbox

import "context"

// RelayBatch lets this package's external tests and benchmarks drive a
// relay one batch at a time; users run Run, and tests of services use
// outboxtest.
func (r *Relay) RelayBatch(ctx context.Context) (int, error) { return r.relayOneBatch(ctx) }

// Close releases the partitions a RelayBatch caller took.
func (r *Relay) Close() { r.close() }

// RelayHealth and Health let the fault tests read the relay's view of its
// dependencies; outside them the metrics and the logs show it.
type RelayHealth = relayHealth

// Health is the relay's health, for the fault tests.
func (r *Relay) Health() RelayHealth { return r.health() }

// Partitions is the number of logical partitions, for the tests that count
// the relays' share of them.
const Partitions = partitionCount
