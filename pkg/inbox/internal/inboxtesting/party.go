package inboxtesting

import (
	"context"
	"sync"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
)

// BookingParty is a third party that cannot dedupe, for the lifecycle tests: Call
// books, then fails with failWith while it is set (a 502 after the booking
// landed); Check says whether the key was booked.
type BookingParty struct {
	mu       sync.Mutex
	booked   map[string]int
	failWith error
	Refuse   map[string]error // event id -> the error Call returns instead of booking; set before the consumer runs
}

// NewBookingParty is a party with nothing booked.
func NewBookingParty() *BookingParty {
	return &BookingParty{booked: map[string]int{}, Refuse: map[string]error{}}
}

// Effect is the party as a lease-mode side effect.
func (p *BookingParty) Effect() lease.Effect {
	return lease.Effect{
		Check: func(_ context.Context, key string) (bool, error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.booked[key] > 0, nil
		},
		Call: func(_ context.Context, _ event.Envelope, key string) error {
			p.mu.Lock()
			defer p.mu.Unlock()
			if err := p.Refuse[key]; err != nil {
				return err
			}
			p.booked[key]++
			return p.failWith
		},
	}
}

// Set makes Call fail with failWith after booking (nil: succeed).
func (p *BookingParty) Set(failWith error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failWith = failWith
}

// Bookings is how often key was booked.
func (p *BookingParty) Bookings(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.booked[key]
}
