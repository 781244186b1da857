package outage

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// The relay's outage logs what retry.Outage reports (its rate and flapping
// are tested there) in the relay's words: the start with the error, the
// reminder with the count, the recovery with how long it lasted.
func TestOutageLogsTheRelaysLines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var buf bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := New("publishing to Kafka", slog.New(slog.NewTextHandler(&buf, nil)), 10*time.Second)
	o.t = retry.NewOutage(10*time.Second, func() time.Time { return now })
	boom := errors.New("dial tcp: connection refused")

	for _, step := range []struct {
		after time.Duration
		fail  bool
		want  []string // in the line logged by this step; nil for none
	}{
		{0, true, []string{"publishing to Kafka failed; retrying with backoff", "connection refused"}},
		{time.Second, true, nil},
		{9 * time.Second, true, []string{"publishing to Kafka still failing; retrying with backoff", "failures=2", "down_for=10s"}},
		{time.Second, false, []string{"publishing to Kafka works again", "failures=3", "down_for=11s"}},
	} {
		now = now.Add(step.after)
		buf.Reset()
		if step.fail {
			o.Fail(ctx, boom)
		} else {
			o.OK(ctx)
		}
		got := strings.TrimSpace(buf.String())
		if step.want == nil && got != "" {
			t.Fatalf("at %v: logged %q, want nothing", now.Format(time.TimeOnly), got)
		}
		for _, w := range step.want {
			if !strings.Contains(got, w) {
				t.Fatalf("at %v: logged %q, want a line with %q", now.Format(time.TimeOnly), got, w)
			}
		}
	}
	if down, _, _ := o.State(); down {
		t.Fatal("State() reports an outage after the recovery")
	}
}
