package lease

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/internal/knob"
)

// The defaults of Config's lease knobs, which a zero field takes (each
// field's doc says it); CallTimeout and LeaseMargin default to fractions of
// LeaseTTL.
const (
	defaultTTL         = 30 * time.Second
	defaultMaxInFlight = 16
)

// Config configures a lease-mode consumer (NewConsumer): the
// inbox.Config of every consumer, and the knobs of leases and side-effect calls,
// which only lease mode has. Zero fields take the documented defaults;
// negative ones are refused by Validate.
type Config struct {
	inbox.Config
	// LeaseTTL is how long a leased message stays with its worker. Every
	// Effect.Check and Effect.Call starts only right after its worker
	// renewed the lease under its fencing token (or took it, a tenth of
	// CallTimeout ago at most), so a lease must outlast
	// CallTimeout + LeaseMargin (Validate refuses it otherwise). Default
	// 30s.
	LeaseTTL time.Duration
	// CallTimeout bounds each Effect.Check and Effect.Call: its ctx ends
	// CallTimeout after the renewal that preceded it, so before the lease
	// does. A call cut off by it counts as the other side being unavailable
	// (an outage: waited out, never an attempt), and the next try checks
	// first. Effect.Check and Effect.Call must honour their ctx. Default
	// LeaseTTL/3 (10s).
	CallTimeout time.Duration
	// LeaseMargin is how long after a call's ctx ended the call may still
	// take effect on the other side: a request already on the wire, the
	// other side finishing what it received. Leases outlast every call by at
	// least this much, so a worker that takes over an expired lease checks
	// only after the previous holder's last possible call has landed; and a
	// worker whose own call failed checks, before trying again, no sooner
	// than this after it. Default LeaseTTL/10 (3s).
	LeaseMargin time.Duration
	// MaxInFlight bounds the side-effect calls (Effect.Check and
	// Effect.Call) the consumer makes at once, across its workers: the most
	// load it puts on the other side. The messages of one key are called
	// one after the other, in order; distinct keys of a batch are called
	// concurrently up to this limit. 1 makes one call at a time. Default
	// 16.
	MaxInFlight int
	// LeaseOwner names this process in lease rows. Default: Name + a random
	// suffix.
	LeaseOwner string
}

// WithDefaults returns c with every zero field, its Config's too, set to
// its documented default; negative values are kept for Validate to refuse.
func (c Config) WithDefaults() Config {
	c.Config = c.Config.WithDefaults()
	knob.Default(&c.LeaseTTL, defaultTTL)
	knob.Default(&c.CallTimeout, c.LeaseTTL/3)
	knob.Default(&c.LeaseMargin, c.LeaseTTL/10)
	knob.Default(&c.MaxInFlight, defaultMaxInFlight)
	if c.LeaseOwner == "" {
		c.LeaseOwner = c.Name + "-" + uuid.NewString()[:8]
	}
	return c
}

// Validate reports what Config.Validate reports, a negative lease knob, or
// a LeaseTTL that does not outlast CallTimeout + LeaseMargin. It checks c as
// NewConsumer would use it, after WithDefaults.
func (c Config) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	if err := knob.RefuseNegative("lease: Config", c); err != nil {
		return err
	}
	d := c.WithDefaults()
	if d.CallTimeout+d.LeaseMargin >= d.LeaseTTL {
		// A call could then still be running, or landing, when its lease
		// expires and another worker takes the message over.
		return fmt.Errorf("lease: Config.LeaseTTL (%v) must exceed CallTimeout (%v) + LeaseMargin (%v): "+
			"a side-effect call must end, and land, before its lease can be taken over", d.LeaseTTL, d.CallTimeout, d.LeaseMargin)
	}
	return nil
}
