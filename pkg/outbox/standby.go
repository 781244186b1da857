package outbox

import "github.com/onceflow/onceflow/pkg/outbox/internal/standby"

// Standby says whether a relay publishes only what the standbys have
// (issue 32): with PublishReplicated, a relay publishes an event only once
// every standby a failover could promote has flushed its commit, so that a
// failover takes back nothing consumers saw. RelayConfig.Standby and
// cdc.Config.Standby take it; see its fields for what each costs. The zero
// value publishes what the primary committed.
type Standby = standby.Config

// DefaultReplicatedWait bounds one wait for the standbys: past it the batch
// (polling relay) or the stream (log-based relay) is abandoned and retried,
// and the relay reports a standby outage. Nothing is charged to a row.
const DefaultReplicatedWait = standby.DefaultWait
