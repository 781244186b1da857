package retry_test

import (
	"errors"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// An outage is reported once when it starts, then at most once per interval
// with the count since the last line, and once when it ends; one that flaps
// within the interval of the last line stays quiet until it lasts.
func TestOutageReportsAtABoundedRate(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := retry.NewOutage(10*time.Second, func() time.Time { return now })
	boom := errors.New("dial tcp: connection refused")

	for i, step := range []struct {
		after    time.Duration
		fail     bool
		want     retry.Event
		failures int           // checked for Continuing and Recovered
		down     time.Duration // checked for Continuing and Recovered
	}{
		{0, true, retry.Started, 0, 0},
		{time.Second, true, retry.Quiet, 0, 0},
		{time.Second, true, retry.Quiet, 0, 0},
		{8 * time.Second, true, retry.Continuing, 3, 10 * time.Second}, // 10s after the first line
		{time.Second, true, retry.Quiet, 0, 0},
		{time.Second, false, retry.Recovered, 5, 12 * time.Second},
		{time.Second, false, retry.Quiet, 0, 0},
		// Flapping: an outage within the interval of the last line is
		// quiet, and so is its recovery.
		{time.Second, true, retry.Quiet, 0, 0},
		{time.Second, false, retry.Quiet, 0, 0},
		{time.Second, true, retry.Quiet, 0, 0},
		// ... until it lasts past the interval.
		{8 * time.Second, true, retry.Continuing, 2, 8 * time.Second},
		{time.Second, false, retry.Recovered, 2, 9 * time.Second},
		{20 * time.Second, true, retry.Started, 0, 0}, // a new outage, long after
	} {
		now = now.Add(step.after)
		var r retry.Report
		if step.fail {
			r = o.Fail(boom)
		} else {
			r = o.OK()
		}
		if r.Event != step.want {
			t.Fatalf("step %d: event %v, want %v", i, r.Event, step.want)
		}
		if r.Event == retry.Continuing || r.Event == retry.Recovered {
			if r.Failures != step.failures || r.Down != step.down {
				t.Fatalf("step %d: %d failures over %v, want %d over %v", i, r.Failures, r.Down, step.failures, step.down)
			}
		}
		if (r.Event == retry.Started || r.Event == retry.Continuing) && !errors.Is(r.Err, boom) {
			t.Fatalf("step %d: error %v, want the failure's", i, r.Err)
		}
	}
	if down, since, err := o.State(); !down || !since.Equal(now) || !errors.Is(err, boom) {
		t.Fatalf("State() = %v, %v, %v; want the outage that began now with its error", down, since, err)
	}
	o.OK()
	if down, _, err := o.State(); down || err != nil {
		t.Fatalf("State() = %v, %v after a success; want no outage", down, err)
	}
}

// Without a clock an Outage keeps time.Now's, and a zero interval reports
// every failure.
func TestOutageDefaults(t *testing.T) {
	t.Parallel()
	o := retry.NewOutage(0, nil)
	boom := errors.New("boom")
	if r := o.Fail(boom); r.Event != retry.Started {
		t.Fatalf("first failure: %v, want Started", r.Event)
	}
	if r := o.Fail(boom); r.Event != retry.Continuing || r.Failures != 1 {
		t.Fatalf("second failure with a zero interval: %+v, want Continuing with 1 failure", r)
	}
}
