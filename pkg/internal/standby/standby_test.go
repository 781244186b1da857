package standby

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

func TestParseLSNReadsPostgresTextForm(t *testing.T) {
	for in, want := range map[string]LSN{"0/0": 0, "16/B374D848": 0x16B374D848, "FFFFFFFF/FFFFFFFF": 1<<64 - 1} {
		got, err := ParseLSN(in)
		if err != nil || got != want || got.String() != in {
			t.Errorf("ParseLSN(%q) = %v (%s), %v; want %v", in, uint64(got), got, err, uint64(want))
		}
	}
	for _, bad := range []string{"", "16", "x/1", "1/", "/1", "G/1", "1/100000000", "100000000/0"} {
		if _, err := ParseLSN(bad); err == nil {
			t.Errorf("ParseLSN(%q): no error", bad)
		}
	}
}

func TestPositionHasNothingWithoutAStandby(t *testing.T) {
	if (Position{Primary: 5, Standby: 9, Slots: 0}).Has(1) {
		t.Error("no slot: Has must be false")
	}
	if !(Position{Standby: 9, Slots: 1}).Has(9) || (Position{Standby: 8, Slots: 1}).Has(9) {
		t.Error("Has compares the standbys' position with the target")
	}
}

// ParseLSN reads pg_lsn's text as pglogrepl does, so the polling relay's
// wait compares positions exactly as before it stopped importing it.
func TestParseLSNReadsAsPglogrepl(t *testing.T) {
	for _, s := range []string{"0/0", "16/B374D848", "0/1", "FFFFFFFF/FFFFFFFF", "1/0"} {
		got, err := ParseLSN(s)
		if err != nil {
			t.Fatalf("ParseLSN(%q): %v", s, err)
		}
		want, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatalf("pglogrepl.ParseLSN(%q): %v", s, err)
		}
		if uint64(got) != uint64(want) || got.String() != want.String() {
			t.Errorf("ParseLSN(%q) = %d %s, pglogrepl reads %d %s", s, got, got, want, want)
		}
	}
}
