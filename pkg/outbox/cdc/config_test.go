package cdc_test

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestCDCConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  cdc.Config
		want string // "" for valid; else a substring of the error
	}{
		{"zero takes the defaults", cdc.Config{}, ""},
		{"WAL-only", cdc.Config{Mode: outbox.ModeWAL, Slot: "orders_outbox"}, ""},
		{"negative batch size", cdc.Config{BatchSize: -1}, "cdc.Config.BatchSize is negative"},
		{"negative retain", cdc.Config{Retain: -time.Minute}, "cdc.Config.Retain is negative (-1m0s)"},
		{"negative max attempts", cdc.Config{MaxAttempts: -3}, "cdc.Config.MaxAttempts is negative"},
		{"negative status interval", cdc.Config{StatusInterval: -time.Second}, "StatusInterval is negative"},
		{"negative standby wait", cdc.Config{Standby: outbox.Standby{ReplicatedWait: -time.Second}}, "cdc.Config.Standby.ReplicatedWait is negative (-1s)"},
		{"slot name Postgres refuses", cdc.Config{Slot: "Orders-Outbox"}, `slot name "Orders-Outbox"`},
		{"a mode that is not log-based", cdc.Config{Mode: outbox.ModePoll}, "cdc.Config.Mode must be cdc or wal"},
		{"backoff bounds crossed", cdc.Config{BackoffMin: 3 * time.Second}, "cdc.Config.BackoffMin (3s) exceeds BackoffMax (2s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testenv.CheckErr(t, tt.cfg.Validate(), tt.want)
			_, err := cdc.NewRelay(testenv.LazyPool(t), nopWriter{}, tt.cfg)
			testenv.CheckErr(t, err, tt.want)
		})
	}
}

// The documented defaults, as each field's doc comment gives them.
func TestConfigDefaultsAreTheDocumentedOnes(t *testing.T) {
	t.Parallel()
	c := cdc.Config{}.WithDefaults()
	for _, d := range []struct {
		name      string
		got, want any
	}{
		{"CDC.Slot", c.Slot, "onceflow_outbox"},
		{"CDC.Mode", c.Mode, outbox.ModeCDC},
		{"CDC.BatchSize", c.BatchSize, 500},
		{"CDC.MaxInFlight", c.MaxInFlight, 4 * 500},
		{"CDC.FlushDelay", c.FlushDelay, 2 * time.Millisecond},
		{"CDC.StatusInterval", c.StatusInterval, time.Second},
		{"CDC.LagInterval", c.LagInterval, 2 * time.Second},
		{"CDC.RetentionInterval", c.RetentionInterval, 5 * time.Second},
		{"CDC.RetentionBatch", c.RetentionBatch, 1000},
		{"CDC.Retain", c.Retain, time.Minute},
		{"CDC.PublishTimeout", c.PublishTimeout, 30 * time.Second},
		{"CDC.MaxAttempts", c.MaxAttempts, 3},
		{"CDC.BackoffMin", c.BackoffMin, 100 * time.Millisecond},
		{"CDC.BackoffMax", c.BackoffMax, 2 * time.Second},
		{"CDC.OutageBackoffMin", c.OutageBackoffMin, 100 * time.Millisecond},
		{"CDC.OutageBackoffMax", c.OutageBackoffMax, 5 * time.Second},
		{"CDC.LogInterval", c.LogInterval, 30 * time.Second},
	} {
		if d.got != d.want {
			t.Errorf("%s = %v, want %v", d.name, d.got, d.want)
		}
	}
	if d := (cdc.Config{Retain: -1}).WithDefaults(); d.Retain != -1 {
		t.Errorf("cdc.Config.WithDefaults changed a negative Retain to %v; Validate must see it", d.Retain)
	}
}
