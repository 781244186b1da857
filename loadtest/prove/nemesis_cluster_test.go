package prove

import (
	"slices"
	"testing"
	"time"
)

// NEMESIS_TOPOLOGY=ha adds the cluster's kinds to the schedule (all of
// them, or those NEMESIS= names, never those it excludes); on one broker
// they are refused by name and absent otherwise.
func TestClusterKindsFollowTheTopology(t *testing.T) {
	for _, tc := range []struct {
		sel      []string
		topology string
		want     []string // cluster kinds in the result
		err      bool
	}{
		{nil, "", nil, false},
		{nil, TopologyHA, NemClusterKinds, false},
		{[]string{"-majority"}, TopologyHA, []string{NemLeaderKill, NemBrokerPause, NemMinority}, false},
		{[]string{"leaderkill", "minority"}, TopologyHA, []string{NemLeaderKill, NemMinority}, false},
		{[]string{"pause"}, TopologyHA, nil, false},
		{[]string{"leaderkill"}, "", nil, true},
	} {
		kinds, err := chosenKinds(tc.sel, "poll")
		if err == nil {
			kinds, err = withTopology(kinds, tc.sel, tc.topology)
		}
		if (err != nil) != tc.err {
			t.Errorf("NEMESIS=%v NEMESIS_TOPOLOGY=%q: error %v, want one: %v", tc.sel, tc.topology, err, tc.err)
			continue
		}
		var got []string
		for _, k := range kinds {
			if slices.Contains(NemClusterKinds, k) {
				got = append(got, k)
			}
		}
		if !tc.err && !slices.Equal(got, tc.want) {
			t.Errorf("NEMESIS=%v NEMESIS_TOPOLOGY=%q: cluster kinds %v, want %v", tc.sel, tc.topology, got, tc.want)
		}
	}
	if _, err := ParseTopology("triple"); err == nil {
		t.Error("NEMESIS_TOPOLOGY=triple was taken")
	}
}

// The cluster steps are drawn from the seed like the others: same seed,
// same brokers, partitions and holds; the pauses outlast the brokers' (9 s)
// and the groups' (10 s) session timeouts.
func TestClusterSchedule(t *testing.T) {
	a := schedule(5, NemClusterKinds, 5*time.Minute, nil)
	if !slices.Equal(a, schedule(5, NemClusterKinds, 5*time.Minute, nil)) {
		t.Fatal("seed 5 gave two schedules")
	}
	seen := map[string]bool{}
	for _, s := range a {
		seen[s.Kind] = true
		switch s.Kind {
		case NemBrokerPause:
			if s.Hold <= 10*time.Second || s.N < 1 || s.N > haBrokers {
				t.Errorf("%s: want a broker 1–3 paused past 10s", s)
			}
		case NemMinority, NemMajority:
			if s.N < 1 || s.N > haBrokers || s.Hold <= 0 {
				t.Errorf("%s: want a broker 1–3 and a hold", s)
			}
		case NemLeaderKill:
			if s.Target != "orders" && s.Target != "billing" || s.Param == "" {
				t.Errorf("%s: want a partition of the orders or billing topic", s)
			}
		}
	}
	for _, k := range NemClusterKinds {
		if !seen[k] {
			t.Errorf("5 minutes of cluster faults scheduled no %s", k)
		}
	}
}
