package prove

import (
	"slices"
	"testing"
	"time"
)

// pgfailover needs a stack with a standby: it is never in the default set,
// runs when named, and its steps starve the standby for 1–6 s.
func TestPGFailoverRunsOnlyWhenNamed(t *testing.T) {
	all, err := chosenKinds(nil, "cdc")
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(all, NemPGFailover) {
		t.Fatalf("the default kinds %v hold %s, which needs PG_REPLICATION", all, NemPGFailover)
	}
	named, err := chosenKinds([]string{NemPGFailover}, "poll")
	if err != nil || !slices.Equal(named, []string{NemPGFailover}) {
		t.Fatalf("NEMESIS=%s: %v, %v", NemPGFailover, named, err)
	}
	for _, s := range schedule(3, named, 60*time.Second, nil) {
		if s.Kind != NemPGFailover || s.Hold < pgFailoverLagMin || s.Hold > pgFailoverLagMax {
			t.Fatalf("step %s: want pgfailover starving the standby %s–%s", s, pgFailoverLagMin, pgFailoverLagMax)
		}
	}
	if _, err := ParsePGReplication("semi"); err == nil {
		t.Fatal("PG_REPLICATION=semi accepted")
	}
}
