// Package cdc is the outbox's log-based relay: Relay publishes from
// Postgres's logical replication stream instead of polling, through one
// pgoutput slot, from two sources: the inserts into outbox_events (rows
// written by outbox.Enqueue, never updated by the relay, deleted by its
// retention once the slot confirmed their commit: package outbox's
// internal/lifecycle writes down every row's states and transitions, and
// what "published" means in each mode), and events written by Emit into the
// WAL only (pg_logical_emit_message: no row, no index). The slot's confirmed
// position moves only after Kafka acknowledged every event before it, so a
// relay that dies loses nothing and its successor republishes what was not
// confirmed; commit order gives each aggregate's order; one relay streams
// per slot while the others stand by. Messages are built with the polling
// relay's conversion, so consumers cannot tell the two apart. Each topic is
// written on its own, so a topic that cannot be written holds back only its
// own events; a transaction's events go to Kafka in chunks as they are
// decoded, so memory stays bounded (MaxInFlight) whatever the transaction's
// size. A message Kafka keeps refusing is skipped as dead (logged, counted,
// its row marked dead) rather than holding the whole stream; in table mode
// its aggregate's later events are held back behind it (marked dead too)
// until it is requeued, so no consumer sees them first. So is a message
// under EmitPrefix that is not a valid envelope. A lost or invalidated slot
// is detected and replaced; in table mode the relay republishes the window
// from the table before it streams, in WAL-only mode (Config.Mode) the
// window's events are reported lost (LostSlot, a metric, a log record with
// the LSN range). docs/runbook-cdc.md is the operator's side.
//
// A service picks the mode at start (outbox.RelayMode, RELAY_MODE in the
// services): in outbox.ModeCDC it writes with outbox.Enqueue, in
// outbox.ModeWAL with Emit. Write and Queue give the write of a mode, and
// NewPublisher builds the relay of any mode, the polling one included,
// from one PublisherConfig, so a service runs whichever it gets. Knobs and
// their defaults are documented on Config, with package outbox's
// convention; the metrics are outbox.Metrics, shared with the polling
// relay. The operator functions are package outboxadmin's, which take the
// mode (outboxadmin.Replay(ctx, db, outbox.ModeCDC, …), …): they read and
// write the table, not the stream.
package cdc
