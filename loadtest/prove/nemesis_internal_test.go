package prove

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSchedule: the schedule is a pure function of the seed, the kinds and
// the targets, so a failing seed replays the same steps.
func TestSchedule(t *testing.T) {
	all, err := chosenKinds(nil, "cdc")
	if err != nil {
		t.Fatal(err)
	}
	a, b := schedule(41, all, 5*time.Minute, nil), schedule(41, all, 5*time.Minute, nil)
	if !slices.Equal(a, b) {
		t.Fatalf("seed 41 gave two schedules:\n%v\n%v", a, b)
	}
	if c := schedule(42, all, 5*time.Minute, nil); slices.Equal(a, c) {
		t.Fatal("seeds 41 and 42 gave the same schedule")
	}
	if len(a) < 30 {
		t.Fatalf("5 minutes gave %d steps, want a fault every few seconds", len(a))
	}
	for _, s := range schedule(7, all, 3*time.Minute, []string{"billing"}) {
		if (s.Kind == NemPause || s.Kind == NemKill || s.Kind == NemMember) && !strings.HasPrefix(s.Target, "billing") {
			t.Errorf("NEMESIS_TARGETS=billing scheduled %s", s)
		}
	}

	tests := []struct {
		sel     string
		mode    string
		want    []string
		wantErr bool
	}{
		{"", "poll", []string{NemPause, NemKill, NemMember, NemKafka, NemPostgres, NemNet, NemThirdParty, NemOperator, NemLimit, NemFailover}, false},
		{"", "wal", []string{NemPause, NemKill, NemMember, NemKafka, NemPostgres, NemNet, NemThirdParty, NemOperator, NemFailover}, false},
		{"slot,limit", "wal", []string{NemSlot, NemLimit}, false},
		{"", "cdc", NemesisKinds, false},
		{"pause,thirdparty", "cdc", []string{NemPause, NemThirdParty}, false},
		{"-kafka,-postgres,-slot,-limit", "cdc", []string{NemPause, NemKill, NemMember, NemNet, NemThirdParty, NemOperator, NemFailover}, false},
		{"longtx,publication", "cdc", []string{NemLongTx, NemPublication}, false},
		{"pause,longtx,publication", "wal", []string{NemPause, NemLongTx}, false},
		{"walstart", "wal", []string{NemWALStart}, false},
		{"walstart,longtx", "cdc", []string{NemLongTx}, false},
		{"slot", "poll", nil, true},
		{"nosuch", "poll", nil, true},
	}
	for _, tt := range tests {
		var sel []string
		if tt.sel != "" {
			sel = strings.Split(tt.sel, ",")
		}
		got, err := chosenKinds(sel, tt.mode)
		if (err != nil) != tt.wantErr || (!tt.wantErr && !slices.Equal(got, tt.want)) {
			t.Errorf("chosenKinds(%q, %s) = %v, %v; want %v (error %v)", tt.sel, tt.mode, got, err, tt.want, tt.wantErr)
		}
	}
}
