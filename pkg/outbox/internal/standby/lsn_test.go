package standby

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

// ParseLSN reads pg_lsn's text as pglogrepl does, so the polling relay's
// wait compares positions exactly as before it stopped importing it.
func TestParseLSNReadsAsPglogrepl(t *testing.T) {
	t.Parallel()
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
	for _, s := range []string{"", "16", "16/", "/1", "G/1", "1/100000000"} {
		if _, err := ParseLSN(s); err == nil {
			t.Errorf("ParseLSN(%q) took it, want an error", s)
		}
	}
}
