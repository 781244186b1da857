package retry

import (
	"sync"
	"time"
)

// Outage follows one thing a worker does against a dependency (publishing
// to Kafka, fetching, claiming rows in Postgres, …) through failures and
// recoveries, and says which of them deserve a log line: the first failure,
// then at most one per interval with the count since the last line, and
// one when it works again. A worker that logged every failed attempt of a
// minutes-long outage would bury the lines that matter.
//
// A dependency that flaps (fails, works, fails again within the interval)
// does not get a pair of lines per flap either: an outage that starts
// within the interval of the last line is reported only once it has lasted
// the interval, and its recovery only if it was reported.
//
// Outage decides and the caller logs, in its own words and with its own
// attributes; the outbox relay and the inbox consumer share this so both
// libraries bound their logs the same way. It is safe for concurrent use.
type Outage struct {
	interval time.Duration
	now      func() time.Time

	mu        sync.Mutex
	since     time.Time // first failure of the current outage; zero while healthy
	failures  int       // since `since`
	unlogged  int       // failures since the last line
	logged    time.Time // when the last line about this was reported
	announced bool      // the current outage has been reported
	lastErr   error
}

// NewOutage returns an Outage that reports at most one line per interval.
// now is the clock the interval is kept by (tests move it); nil means
// time.Now.
func NewOutage(interval time.Duration, now func() time.Time) *Outage {
	if now == nil {
		now = time.Now
	}
	return &Outage{interval: interval, now: now}
}

// Event is what a failure or success means for the log.
type Event int

const (
	// Quiet: nothing to log (a failure within the interval, a success
	// without an outage, or the end of an outage never reported).
	Quiet Event = iota
	// Started: an outage began; log its error.
	Started
	// Continuing: an outage goes on and the interval has passed since the
	// last line; log the count of failures since then.
	Continuing
	// Recovered: a reported outage ended; log how long it lasted.
	Recovered
)

// Report is what to log about one Fail or OK.
type Report struct {
	Event Event
	// Failures is, for Continuing, the failures since the last line (this
	// one included); for Recovered, every failure of the outage.
	Failures int
	// Down is how long the outage has lasted (Continuing, Recovered).
	Down time.Duration
	// Err is the failure's error (Started, Continuing).
	Err error
}

// Fail records a failure with err. The report is Started when it begins an
// outage (unless a line was reported within the interval), Continuing when
// the interval has passed since the last line, Quiet otherwise.
func (o *Outage) Fail(err error) Report {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	o.lastErr = err
	o.failures++
	o.unlogged++
	quiet := !o.logged.IsZero() && now.Sub(o.logged) < o.interval
	if o.since.IsZero() {
		o.since, o.failures, o.unlogged, o.announced = now, 1, 1, false
		if quiet {
			return Report{}
		}
		o.logged, o.unlogged, o.announced = now, 0, true
		return Report{Event: Started, Failures: 1, Err: err}
	}
	if quiet {
		return Report{}
	}
	r := Report{Event: Continuing, Failures: o.unlogged, Down: now.Sub(o.since), Err: err}
	o.logged, o.unlogged, o.announced = now, 0, true
	return r
}

// OK records a success, which ends the outage; the report is Recovered if
// the outage was reported, Quiet otherwise.
func (o *Outage) OK() Report {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return Report{}
	}
	var r Report
	if o.announced {
		now := o.now()
		r = Report{Event: Recovered, Failures: o.failures, Down: now.Sub(o.since)}
		o.logged = now
	}
	o.since, o.failures, o.unlogged, o.announced, o.lastErr = time.Time{}, 0, 0, false, nil
	return r
}

// Down reports whether an outage is under way.
func (o *Outage) Down() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero()
}

// State reports whether an outage is under way, since when and its last error.
func (o *Outage) State() (down bool, since time.Time, lastErr error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero(), o.since, o.lastErr
}
