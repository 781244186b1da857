package harness_test

import (
	"strings"
	"testing"

	"github.com/onceflow/onceflow/platform/harness"
)

func TestSumMetricsSumsOverLabels(t *testing.T) {
	t.Parallel()
	text := `# HELP outbox_published_total Outbox events the broker acknowledged.
# TYPE outbox_published_total counter
outbox_published_total 1200
outbox_relay_claims_total{result="rows"} 30
outbox_relay_claims_total{result="empty",note="a } b"} 12
outbox_relay_db_roundtrips_total{op="claim"} 42
outbox_relay_db_roundtrips_total{op="commit"} 40
outbox_pending_events 3
go_goroutines 17
`
	outbox := func(name string) bool { return strings.HasPrefix(name, "outbox_") && strings.HasSuffix(name, "_total") }
	for _, tt := range []struct {
		name string
		keep func(string) bool
		want map[string]float64
	}{
		{"kept", outbox, map[string]float64{"outbox_published_total": 1200, "outbox_relay_claims_total": 42, "outbox_relay_db_roundtrips_total": 82}},
		{"all", nil, map[string]float64{"outbox_published_total": 1200, "outbox_relay_claims_total": 42, "outbox_relay_db_roundtrips_total": 82,
			"outbox_pending_events": 3, "go_goroutines": 17}},
	} {
		got, err := harness.SumMetrics(strings.NewReader(text), tt.keep)
		if err != nil || len(got) != len(tt.want) {
			t.Fatalf("%s: SumMetrics = %v, %v; want %v", tt.name, got, err, tt.want)
		}
		for k, v := range tt.want {
			if got[k] != v {
				t.Errorf("%s: %s = %v, want %v", tt.name, k, got[k], v)
			}
		}
	}
}
