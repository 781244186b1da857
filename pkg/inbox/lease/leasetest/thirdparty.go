package leasetest

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
)

// ThirdParty is a stand-in for the other side of a lease-mode consumer
// (lease.NewConsumer): a third party that cannot dedupe. Every call
// that reaches it books under its idempotency key, even a key it has
// booked before, and Check tells whether a key was booked. It is as
// adversarial as a real one on the wire: a call it received is booked when
// its processing ends (SetDelay), whether or not the caller still waits for
// the answer; only a call whose ctx had already ended never reaches it, as
// an HTTP client sends nothing once its request's context is done. Tests
// delay it, take it down and bring it back, and then count what it booked.
// It is safe for concurrent use.
type ThirdParty struct {
	mu       sync.Mutex
	delay    time.Duration
	down     error
	booked   map[string]int // idempotency key -> bookings
	order    []string       // keys in booking order
	checks   int
	received int

	inFlight, maxInFlight atomic.Int32
}

// NewThirdParty returns a third party that answers at once and is up.
func NewThirdParty() *ThirdParty {
	return &ThirdParty{booked: map[string]int{}}
}

// SetDelay makes each call take d from the moment it arrives to its
// booking and answer. A caller that gives up sooner (its ctx ends) gets
// ctx's error at once, and the call is booked all the same when d is over.
func (p *ThirdParty) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// SetDown makes every Check and Call fail with err, booking nothing, until
// SetDown(nil). A lease-mode effect says "unreachable" with an error that
// wraps lease.ErrUnavailable.
func (p *ThirdParty) SetDown(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = err
}

// Effect returns the lease-mode effect that calls p: Check asks whether the
// key was booked, Call books. Done is nil; set it on the copy returned.
func (p *ThirdParty) Effect() lease.Effect {
	return lease.Effect{Check: p.check, Call: p.call}
}

func (p *ThirdParty) check(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down != nil {
		return false, p.down
	}
	p.checks++
	return p.booked[key] > 0, nil
}

func (p *ThirdParty) call(ctx context.Context, _ event.Envelope, key string) error {
	if err := ctx.Err(); err != nil {
		return err // never sent
	}
	p.mu.Lock()
	down, delay := p.down, p.delay
	if down == nil {
		p.received++
	}
	p.mu.Unlock()
	if down != nil {
		return down
	}
	n := p.inFlight.Add(1)
	for top := p.maxInFlight.Load(); n > top && !p.maxInFlight.CompareAndSwap(top, n); top = p.maxInFlight.Load() {
	}
	booked := make(chan struct{})
	// The booking does not depend on the caller waiting: the request has
	// arrived, and the third party finishes it whatever the caller does.
	time.AfterFunc(delay, func() {
		p.mu.Lock()
		p.booked[key]++
		p.order = append(p.order, key)
		p.mu.Unlock()
		p.inFlight.Add(-1)
		close(booked)
	})
	select {
	case <-booked:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Bookings returns how many times key was booked.
func (p *ThirdParty) Bookings(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.booked[key]
}

// Booked returns every key booked at least once, in the order of their
// first booking.
func (p *ThirdParty) Booked() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]bool{}
	var keys []string
	for _, k := range p.order {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// Checks returns how many checks it answered.
func (p *ThirdParty) Checks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.checks
}

// Received returns how many calls reached it (booked, or to be booked once
// their delay is over).
func (p *ThirdParty) Received() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.received
}

// InFlight returns how many calls it is processing now (received, not
// booked yet).
func (p *ThirdParty) InFlight() int { return int(p.inFlight.Load()) }

// MaxInFlight returns the most calls it was processing at once.
func (p *ThirdParty) MaxInFlight() int { return int(p.maxInFlight.Load()) }

// Pausable wraps a lease-mode effect so that a test can freeze the member
// that runs it, as a process stopped by SIGSTOP or a long GC pause would be
// frozen, while it holds a lease. While paused, every Check and Call of the
// member stops before it reaches the other side, holding whatever the
// member holds (its lease, its call slot), and goes on, with the ctx it was
// given, once resumed. It is safe for concurrent use.
type Pausable struct {
	inner lease.Effect

	mu       sync.Mutex
	gate     chan struct{} // closed by Resume; nil while not paused
	waiting  int
	released int
}

// NewPausable returns eff wrapped, running (not paused).
func NewPausable(eff lease.Effect) *Pausable {
	return &Pausable{inner: eff}
}

// Effect returns the wrapped effect, to give to lease.NewConsumer.
func (p *Pausable) Effect() lease.Effect {
	eff := p.inner
	eff.Check = func(ctx context.Context, key string) (bool, error) {
		defer p.hold()()
		return p.inner.Check(ctx, key)
	}
	eff.Call = func(ctx context.Context, ev event.Envelope, key string) error {
		defer p.hold()()
		return p.inner.Call(ctx, ev, key)
	}
	return eff
}

// Pause stops every Check and Call from now on, before it reaches the other
// side, until Resume.
func (p *Pausable) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate == nil {
		p.gate = make(chan struct{})
	}
}

// Resume lets the stopped calls, and every later one, go on.
func (p *Pausable) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

// Waiting returns how many calls are stopped by the pause now.
func (p *Pausable) Waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waiting
}

// Released returns how many of the calls stopped by a pause went on after
// it and have returned.
func (p *Pausable) Released() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.released
}

// hold stops the caller while paused; the function it returns counts the
// call as released once it returns.
func (p *Pausable) hold() func() {
	p.mu.Lock()
	gate := p.gate
	if gate != nil {
		p.waiting++
	}
	p.mu.Unlock()
	if gate == nil {
		return func() {}
	}
	<-gate // a frozen process does not notice its deadlines either
	p.mu.Lock()
	p.waiting--
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.released++
	}
}
