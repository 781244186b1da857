package lease_test

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestLeaseConfigValidate(t *testing.T) {
	t.Parallel()
	named := inbox.Config{Name: "c"}
	tests := []validateCase{
		{"name only takes the defaults", lease.Config{Config: named}, ""},
		{"its Config is checked", lease.Config{Config: inbox.Config{Name: "c", Workers: -1}}, "Config.Workers is negative"},
		{"negative lease", lease.Config{Config: named, LeaseTTL: -time.Second}, "LeaseTTL is negative (-1s)"},
		{"negative calls in flight", lease.Config{Config: named, MaxInFlight: -1}, "MaxInFlight is negative"},
		{"negative call timeout", lease.Config{Config: named, CallTimeout: -time.Second}, "CallTimeout is negative"},
		{"negative lease margin", lease.Config{Config: named, LeaseMargin: -time.Second}, "LeaseMargin is negative"},
		{"call timeout as long as the lease", lease.Config{Config: named, LeaseTTL: time.Second, CallTimeout: time.Second},
			"LeaseTTL (1s) must exceed CallTimeout (1s) + LeaseMargin (100ms)"},
		{"call and margin fill the lease", lease.Config{Config: named, LeaseTTL: time.Second, CallTimeout: 800 * time.Millisecond, LeaseMargin: 200 * time.Millisecond},
			"LeaseTTL (1s) must exceed CallTimeout (800ms) + LeaseMargin (200ms)"},
		{"a long call timeout against the default lease", lease.Config{Config: named, CallTimeout: 30 * time.Second}, "LeaseTTL (30s) must exceed"},
		{"call timeout and margin inside the lease", lease.Config{Config: named, LeaseTTL: time.Second, CallTimeout: 750 * time.Millisecond, LeaseMargin: 200 * time.Millisecond}, ""},
	}
	checkValidateCases(t, tests)
}

// validateCase (as pkg/inbox's config tests have it: a composite literal
// of another package's struct would need its field names) is a configuration and what its Validate must say: "" for
// valid, else a substring of the error.
type validateCase struct {
	name string
	cfg  interface{ Validate() error }
	want string
}

// checkValidateCases checks each case in a parallel subtest.
func checkValidateCases(t *testing.T, tests []validateCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testenv.CheckErr(t, tt.cfg.Validate(), tt.want)
		})
	}
}
