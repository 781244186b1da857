package main

import (
	"strings"
	"testing"
	"time"
)

func TestSumMetric(t *testing.T) {
	text := `# HELP inbox_duplicates_total Redelivered events.
# TYPE inbox_duplicates_total counter
inbox_duplicates_total{consumer="billing"} 3
inbox_duplicates_total{consumer="other"} 4
inbox_duplicates_total_extra 100
inbox_processed_total{consumer="billing"} 9
`
	if got := sumMetric(strings.NewReader(text), "inbox_duplicates_total"); got != 7 {
		t.Fatalf("sum = %v, want 7", got)
	}
}

func TestPercentile(t *testing.T) {
	var lags []time.Duration
	for i := 1; i <= 100; i++ {
		lags = append(lags, time.Duration(i)*time.Millisecond)
	}
	if p50, p99 := percentile(lags, 0.5), percentile(lags, 0.99); p50 != 50*time.Millisecond || p99 != 99*time.Millisecond {
		t.Fatalf("p50=%v p99=%v", p50, p99)
	}
}

func TestFlagsAreValidated(t *testing.T) {
	var out strings.Builder
	if _, err := parseFlags([]string{"-orders", "0"}, &out); err == nil {
		t.Fatal("want an error for -orders 0")
	}
	o, err := parseFlags(nil, &out)
	if err != nil || o.orders != 300 || o.cancelRatio != 0.1 {
		t.Fatalf("defaults: %+v %v", o, err)
	}
}
