// Package leasetest is lease mode's test kit, beside the inbox's
// (pkg/inbox/inboxtest, whose Require helpers read lease-mode rows too):
// Deliver runs an Effect through a lease-mode consumer's real path without
// Kafka, and the adversaries the schedules need stand in for the other
// side: ThirdParty, a third party that cannot dedupe, which books every
// call it receives (also one whose caller gave up) and can be delayed,
// taken down and brought back; and Pausable, which freezes the member
// running an effect while it holds a lease, as SIGSTOP would, so that a
// second member takes the message over before the first one wakes up.
package leasetest

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
)

// Deliver is inboxtest.Deliver for a lease-mode consumer (lease.NewConsumer)
// running eff. Retry backoffs default to 1ms–10ms, as there, and
// LeaseMargin to 10ms (there is no wire for a failed call to land late on,
// unless the effect makes one).
func Deliver(t testing.TB, pool *pgxpool.Pool, cfg lease.Config, eff lease.Effect, evs ...event.Envelope) []kafka.Message {
	t.Helper()
	if cfg.BackoffMin == 0 && cfg.BackoffMax == 0 {
		cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 10*time.Millisecond
	}
	if cfg.LeaseMargin == 0 {
		cfg.LeaseMargin = 10 * time.Millisecond
	}
	return inboxtest.DeliverWith(t, func(src inbox.GroupConfig, dlq inbox.Writer) (*inbox.Consumer, error) {
		return lease.NewConsumer(pool, src, dlq, eff, cfg)
	}, evs...)
}
