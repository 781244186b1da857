package outbox

import "fmt"

// RelayMode is how a service's events reach Kafka (RELAY_MODE in the
// services). Every mode publishes the same messages; they differ in what
// the writer pays and what the operator runs.
type RelayMode string

const (
	// ModePoll: Enqueue writes a row, the polling Relay publishes it and
	// marks it published.
	ModePoll RelayMode = "poll"
	// ModeCDC: Enqueue writes a row, a cdc.Relay publishes it from the
	// replication stream and never updates it; retention deletes it.
	ModeCDC RelayMode = "cdc"
	// ModeWAL: cdc.Emit writes the event into the WAL only, a cdc.Relay
	// publishes it. No row, no index.
	ModeWAL RelayMode = "wal"
	// ModeDebezium: Enqueue writes a row, and a publisher outside the
	// service streams it from a replication slot of its own: Debezium's
	// PostgreSQL connector with the outbox EventRouter (docs/debezium). The
	// service runs no relay. Nothing marks the rows published, so they stay
	// pending until retention deletes them by age
	// (PruneConfig.PendingRetention), and the backlog is read from the
	// publisher's slot (Metrics.WatchSlot), not from the table.
	ModeDebezium RelayMode = "debezium"
)

// ParseRelayMode accepts poll, cdc, wal or debezium.
func ParseRelayMode(s string) (RelayMode, error) {
	switch m := RelayMode(s); m {
	case ModePoll, ModeCDC, ModeWAL, ModeDebezium:
		return m, nil
	}
	return "", fmt.Errorf("outbox: relay mode must be poll, cdc, wal or debezium, got %q", s)
}

// External reports whether events of mode m are published by a process
// other than the service (ModeDebezium): the service then runs no relay.
func (m RelayMode) External() bool { return m == ModeDebezium }
