package engine

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/testenv"
)

// A batch's time is one observation of inbox_batch_seconds, not n made-up
// per-message durations; only a message handled alone is a per-message
// observation.
func TestProcessingTimeIsRecordedPerBatchHonestly(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.init("c")
	m.record("c", [NumOutcomes]int{Processed: 5}, 5, 50*time.Millisecond)
	if got := testenv.MetricValue(t, reg, "inbox_batch_seconds"); got != 1 {
		t.Fatalf("inbox_batch_seconds has %v observations after one batch, want 1", got)
	}
	if got := testenv.MetricValue(t, reg, "inbox_processing_seconds"); got != 0 {
		t.Fatalf("inbox_processing_seconds has %v observations after one batch of 5, want 0", got)
	}
	m.record("c", [NumOutcomes]int{Processed: 1}, 1, 10*time.Millisecond)
	if got := testenv.MetricValue(t, reg, "inbox_processing_seconds"); got != 1 {
		t.Fatalf("inbox_processing_seconds has %v observations after a message alone, want 1", got)
	}
	if got := testenv.MetricValue(t, reg, "inbox_processed_total"); got != 6 {
		t.Fatalf("inbox_processed_total = %v, want 6", got)
	}
}
