package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
)

// RelayMode is how a service's events reach Kafka (RELAY_MODE in the
// services). Every mode publishes the same messages; they differ in what
// the writer pays and what the operator runs.
type RelayMode string

const (
	// ModePoll: Enqueue writes a row, the polling Relay publishes it and
	// marks it published.
	ModePoll RelayMode = "poll"
	// ModeCDC: Enqueue writes a row, a CDCRelay publishes it from the
	// replication stream and never updates it; retention deletes it.
	ModeCDC RelayMode = "cdc"
	// ModeWAL: Emit writes the event into the WAL only, a CDCRelay
	// publishes it. No row, no index.
	ModeWAL RelayMode = "wal"
)

// ParseRelayMode accepts poll, cdc or wal.
func ParseRelayMode(s string) (RelayMode, error) {
	switch m := RelayMode(s); m {
	case ModePoll, ModeCDC, ModeWAL:
		return m, nil
	}
	return "", fmt.Errorf("outbox: relay mode must be poll, cdc or wal, got %q", s)
}

// WriteFunc writes one event inside the caller's transaction.
type WriteFunc func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error

// Write is the write of mode m: Emit for wal, Enqueue otherwise, so that
// business code calls one function whatever relay runs.
func (m RelayMode) Write() WriteFunc {
	if m == ModeWAL {
		return Emit
	}
	return Enqueue
}
