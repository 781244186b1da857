package outbox

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// An outage is logged once when it starts, then at most once per interval
// with the count since the last line, and once when it ends.
func TestOutageLogsAtABoundedRate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var buf bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := newOutage("publishing to Kafka", slog.New(slog.NewTextHandler(&buf, nil)), 10*time.Second)
	o.now = func() time.Time { return now }
	boom := errors.New("dial tcp: connection refused")

	for _, step := range []struct {
		after time.Duration
		fail  bool
		want  string // the line logged by this step, "" for none
	}{
		{0, true, "publishing to Kafka failed; retrying with backoff"},
		{time.Second, true, ""},
		{time.Second, true, ""},
		{8 * time.Second, true, "still failing; retrying with backoff"}, // 10s after the first line
		{time.Second, true, ""},
		{time.Second, false, "publishing to Kafka works again"},
		{time.Second, false, ""},
		// Flapping: an outage within the interval of the last line is
		// quiet, and so is its recovery.
		{time.Second, true, ""},
		{time.Second, false, ""},
		{time.Second, true, ""},
		// ... until it lasts past the interval.
		{8 * time.Second, true, "still failing; retrying with backoff"},
		{time.Second, false, "publishing to Kafka works again"},
		{20 * time.Second, true, "publishing to Kafka failed; retrying with backoff"}, // a new outage, long after
	} {
		now = now.Add(step.after)
		buf.Reset()
		if step.fail {
			o.fail(ctx, boom)
		} else {
			o.ok(ctx)
		}
		got := strings.TrimSpace(buf.String())
		switch {
		case step.want == "" && got != "":
			t.Fatalf("at %v: logged %q, want nothing", now.Format(time.TimeOnly), got)
		case step.want != "" && !strings.Contains(got, step.want):
			t.Fatalf("at %v: logged %q, want a line with %q", now.Format(time.TimeOnly), got, step.want)
		}
		if strings.Contains(got, "still failing") && !strings.Contains(got, "failures=") {
			t.Fatalf("the periodic line %q should count the failures since the last line", got)
		}
		if strings.Contains(got, "works again") && !strings.Contains(got, "down_for=") {
			t.Fatalf("the recovery line %q should say how long the outage lasted", got)
		}
	}
	if down, _, _ := o.state(); !down {
		t.Fatal("state() reports no outage after a failure")
	}
}
