package apperr_test

import (
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pkg/platform/apperr"
)

func TestQuoteCutsLongInput(t *testing.T) {
	t.Parallel()
	if got := apperr.Quote("EUR"); got != `"EUR"` {
		t.Fatalf("Quote(EUR) = %s", got)
	}
	long := strings.Repeat("é", 1000) // 2 bytes each: the cut must not split one
	got := apperr.Quote(long)
	if len(got) > apperr.MaxQuote+40 || !strings.HasSuffix(got, "(2000 bytes)") || strings.Contains(got, `\x`) {
		t.Fatalf("Quote of 2000 bytes = %s", got)
	}
}

func TestCheckText(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		s  string
		ok bool
	}{{"", true}, {"key-1 ü", true}, {"k\x00", false}, {"k\xff", false}, {"\xc3", false}} {
		err := apperr.CheckText("the value", tt.s)
		if (err == nil) != tt.ok {
			t.Errorf("CheckText(%q) = %v, want ok=%v", tt.s, err, tt.ok)
		}
		if ae, isApp := apperr.As(err); err != nil && (!isApp || ae.Code != apperr.Malformed) {
			t.Errorf("CheckText(%q) = %v, want Malformed", tt.s, err)
		}
	}
}
