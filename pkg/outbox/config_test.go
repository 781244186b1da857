package outbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestRelayConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  outbox.RelayConfig
		want string // "" for valid; else a substring of the error
	}{
		{"zero takes the defaults", outbox.RelayConfig{}, ""},
		{"explicit values", outbox.RelayConfig{BatchSize: 10, RebalanceInterval: time.Second, RelayTTL: 3 * time.Second}, ""},
		{"negative batch size", outbox.RelayConfig{BatchSize: -1}, "BatchSize is negative"},
		{"negative poll interval", outbox.RelayConfig{PollInterval: -time.Second}, "PollInterval is negative (-1s)"},
		{"negative max attempts", outbox.RelayConfig{MaxAttempts: -3}, "MaxAttempts is negative"},
		{"negative outage backoff", outbox.RelayConfig{OutageBackoffMax: -1}, "OutageBackoffMax is negative"},
		{"negative linger", outbox.RelayConfig{Linger: -time.Millisecond}, "Linger is negative (-1ms)"},
		{"negative standby wait", outbox.RelayConfig{Standby: outbox.Standby{ReplicatedWait: -time.Second}}, "RelayConfig.Standby.ReplicatedWait is negative (-1s)"},
		{"TTL equal to the heartbeat", outbox.RelayConfig{RebalanceInterval: time.Second, RelayTTL: time.Second}, "RelayTTL (1s) must exceed RebalanceInterval (1s)"},
		{"TTL below the default heartbeat", outbox.RelayConfig{RelayTTL: time.Second}, "must exceed RebalanceInterval (2s)"},
		{"backoff bounds crossed", outbox.RelayConfig{BackoffMin: 2 * time.Minute}, "BackoffMin (2m0s) exceeds BackoffMax (1m0s)"},
		{"outage backoff bounds crossed", outbox.RelayConfig{OutageBackoffMin: time.Second, OutageBackoffMax: time.Millisecond}, "OutageBackoffMin (1s) exceeds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.cfg.Validate()
			testenv.CheckErr(t, err, tt.want)
		})
	}
}

func TestRelayConfigWithDefaultsKeepsNegatives(t *testing.T) {
	t.Parallel()
	d := outbox.RelayConfig{BatchSize: -1}.WithDefaults()
	if d.BatchSize != -1 || d.PollInterval != time.Second || d.RelayTTL != 6*time.Second {
		t.Fatalf("WithDefaults gave BatchSize %d, PollInterval %v, RelayTTL %v; want -1, 1s, 6s", d.BatchSize, d.PollInterval, d.RelayTTL)
	}
}

// The documented defaults, as each field's doc comment gives them (the
// log-based relay's are checked in package outbox/cdc).
func TestConfigDefaultsAreTheDocumentedOnes(t *testing.T) {
	t.Parallel()
	r := outbox.RelayConfig{}.WithDefaults()
	for _, d := range []struct {
		name      string
		got, want any
	}{
		{"Relay.BatchSize", r.BatchSize, 500},
		{"Relay.PollInterval", r.PollInterval, time.Second},
		{"Relay.Linger", r.Linger, time.Millisecond},
		{"Relay.RebalanceInterval", r.RebalanceInterval, 2 * time.Second},
		{"Relay.RelayTTL", r.RelayTTL, 3 * 2 * time.Second},
		{"Relay.LockTimeout", r.LockTimeout, 10 * time.Second},
		{"Relay.PublishTimeout", r.PublishTimeout, 30 * time.Second},
		{"Relay.MaxAttempts", r.MaxAttempts, 10},
		{"Relay.BackoffMin", r.BackoffMin, 100 * time.Millisecond},
		{"Relay.BackoffMax", r.BackoffMax, time.Minute},
		{"Relay.OutageBackoffMin", r.OutageBackoffMin, 100 * time.Millisecond},
		{"Relay.OutageBackoffMax", r.OutageBackoffMax, 10 * time.Second},
		{"Relay.LogInterval", r.LogInterval, 30 * time.Second},
	} {
		if d.got != d.want {
			t.Errorf("%s = %v, want %v", d.name, d.got, d.want)
		}
	}
}

// NewRelay refuses what Validate refuses, before it touches the database.
func TestNewRelayValidates(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewRelay(testenv.LazyPool(t), nopWriter{}, outbox.RelayConfig{RelayTTL: time.Millisecond})
	testenv.CheckErr(t, err, "RelayTTL")
}

// Constructors refuse a configuration no relay can run with; Validate says
// why before anything starts.
func ExampleRelayConfig_Validate() {
	fmt.Println(outbox.RelayConfig{RebalanceInterval: 5 * time.Second, RelayTTL: 5 * time.Second}.Validate())
	fmt.Println(outbox.RelayConfig{PollInterval: -time.Second}.Validate())
	// Output:
	// outbox: RelayConfig.RelayTTL (5s) must exceed RebalanceInterval (5s)
	// outbox: RelayConfig.PollInterval is negative (-1s); leave it zero for the default
}
