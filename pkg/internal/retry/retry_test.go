package retry_test

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/retry"
)

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	for _, tt := range []struct {
		attempt int
		lo, hi  time.Duration
	}{
		{1, 50 * time.Millisecond, 100 * time.Millisecond},
		{2, 100 * time.Millisecond, 200 * time.Millisecond},
		{4, 400 * time.Millisecond, 800 * time.Millisecond},
		{30, 500 * time.Millisecond, time.Second},
	} {
		for range 50 {
			d := retry.Backoff(tt.attempt, 100*time.Millisecond, time.Second)
			if d < tt.lo || d > tt.hi {
				t.Fatalf("Backoff(%d) = %v, want within [%v, %v]", tt.attempt, d, tt.lo, tt.hi)
			}
		}
	}
}
