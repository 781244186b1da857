package knob

import (
	"testing"
	"time"
)

// RefuseNegative looks only at a config's own int and time.Duration fields:
// not at an int64 whose negative values mean something, a named int (a
// policy), an unexported field or an embedded config, which their configs
// check themselves.
func TestRefuseNegative(t *testing.T) {
	type inner struct{ Size int }
	type policy int
	type config struct {
		inner
		Size    int
		Wait    time.Duration
		Offset  int64
		Policy  policy
		private int
	}
	for _, c := range []struct {
		name string
		cfg  config
		want string
	}{
		{"zero", config{}, ""},
		{"negative size", config{Size: -1}, "lib: Config.Size is negative (-1); leave it zero for the default"},
		{"negative duration", config{Wait: -time.Second}, "lib: Config.Wait is negative (-1s); leave it zero for the default"},
		{"first in field order", config{Size: -1, Wait: -1}, "lib: Config.Size is negative (-1); leave it zero for the default"},
		{"other types are not looked at", config{inner: inner{Size: -1}, Offset: -2, Policy: -1, private: -1}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := RefuseNegative("lib: Config", c.cfg)
			if got := errString(err); got != c.want {
				t.Errorf("RefuseNegative = %q, want %q", got, c.want)
			}
		})
	}
}

func TestDefaultAndRefuseCrossed(t *testing.T) {
	n, d := 0, time.Duration(-1)
	Default(&n, 5)
	Default(&d, time.Second)
	if n != 5 || d != -1 {
		t.Errorf("Default: n = %d (want 5), d = %v (want -1: kept for Validate)", n, d)
	}
	if err := RefuseCrossed("lib: Config", "Min", 2*time.Second, "Max", time.Second); errString(err) != "lib: Config.Min (2s) exceeds Max (1s)" {
		t.Errorf("RefuseCrossed = %v", err)
	}
	if err := RefuseCrossed("lib: Config", "Min", 1, "Max", 1); err != nil {
		t.Errorf("RefuseCrossed of equal bounds = %v, want nil", err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
