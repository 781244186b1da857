package outbox

import "time"

// Standby says whether a relay publishes only what the standbys have
// (issue 32): a commit is visible on the primary, and decoded by a logical
// walsender, before a standby holds it, and an event published then is one
// a failover to that standby takes back. RelayConfig.Standby and
// cdc.Config.Standby take it. The zero value publishes what the primary
// committed.
type Standby struct {
	// PublishReplicated makes the relay publish an event only once every
	// standby named by StandbySlots has flushed its commit. The standbys
	// are followed through their physical replication slots
	// (pg_replication_slots.restart_lsn is the flush position a standby
	// reported, readable by any role), so they must stream through slots,
	// as the dev stack's does and as Patroni and CloudNativePG make them.
	// While no such slot exists, or a standby is down or behind, nothing is
	// published: the relay waits, at most ReplicatedWait at a time, and
	// reports the outage (outbox_standby_waits_total{outcome="timeout"},
	// outbox_standby_behind, a WARN log line); it never marks a row dead
	// for it. The price is a query of the standbys' position on every
	// batch (polling), or whenever a transaction commits past the last
	// position read (log-based: about once per batch of transactions the
	// walsender sends together). Writers must commit with
	// synchronous_commit on (the default): a commit made with it off is
	// visible before the primary itself flushed it, and the polling relay
	// compares with the primary's flush position. Default false.
	PublishReplicated bool
	// StandbySlots names the physical slots whose standbys must have a
	// commit before it is published. Default: every physical slot on the
	// primary.
	StandbySlots []string
	// ReplicatedWait bounds one wait for the standbys: past it the batch
	// (polling relay) or the stream (log-based relay) is abandoned and
	// retried, and the relay reports a standby outage; nothing is charged
	// to a row. The log-based relay sends the server no status update
	// while it waits, so keep it well under the server's wal_sender_timeout
	// (60s by default). Default 5s.
	ReplicatedWait time.Duration
}
