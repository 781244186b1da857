package engine

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// An outage is logged when it starts, at most once per interval while it
// lasts, and when it ends; it is counted every time and shown by the gauge
// and by Healthy. A dead-letter topic that cannot be reached stays broken
// while fetching works.
func TestAnOutageIsLoggedAtABoundedRate(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	m := NewMetrics(nil)
	f := NewFault("kafka", "c", slog.New(slog.NewTextHandler(&logs, nil)), time.Hour, m.kafkaErrors, m.kafkaConnected)
	ctx := context.Background()
	down := errors.New("dial tcp: connection refused")
	for range 100 {
		f.Fail(ctx, "dead_letter", down)
		f.OK(ctx, "fetch") // the source topic still works
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 {
		t.Fatalf("%d log lines for 100 failures within the interval, want 1:\n%s", n, logs.String())
	}
	if got := testutil.ToFloat64(m.kafkaErrors.WithLabelValues("c", "dead_letter")); got != 100 {
		t.Fatalf("inbox_kafka_errors_total = %v, want 100", got)
	}
	if got := testutil.ToFloat64(m.kafkaConnected.WithLabelValues("c")); got != 0 {
		t.Fatalf("inbox_kafka_connected = %v during the outage, want 0", got)
	}
	if err := f.Err(); err == nil || !strings.Contains(err.Error(), "dead_letter") {
		t.Fatalf("err() = %v, want the dead-letter outage", err)
	}
	f.OK(ctx, "dead_letter")
	if !strings.Contains(logs.String(), "reaches kafka again") || strings.Count(logs.String(), "\n") != 2 {
		t.Fatalf("want one recovery line:\n%s", logs.String())
	}
	if got := testutil.ToFloat64(m.kafkaConnected.WithLabelValues("c")); got != 1 || f.Err() != nil {
		t.Fatalf("after recovery: connected %v, err %v", got, f.Err())
	}

	// Once the interval has passed, a failure that goes on is logged again,
	// with the count since the last line.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.now = func() time.Time { return now }
	logs.Reset()
	f.Fail(ctx, "fetch", down)
	f.Fail(ctx, "fetch", down)
	now = now.Add(time.Hour)
	f.Fail(ctx, "fetch", down)
	if !strings.Contains(logs.String(), "still cannot reach kafka") || !strings.Contains(logs.String(), "failures=2") {
		t.Fatalf("want a reminder with the failures since the first line after an interval:\n%s", logs.String())
	}
}
