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
		{time.Second, true, "publishing to Kafka failed; retrying with backoff"}, // a new outage
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
		if strings.Contains(got, "still failing") && !strings.Contains(got, "failures=3") {
			t.Fatalf("the periodic line %q should count the 3 failures since the first line", got)
		}
		if strings.Contains(got, "works again") && !strings.Contains(got, "failures=5") {
			t.Fatalf("the recovery line %q should count the outage's 5 failures", got)
		}
	}
	if down, _, _ := o.state(); !down {
		t.Fatal("state() reports no outage after a failure")
	}
}
