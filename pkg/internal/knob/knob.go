// Package knob is the config convention of both libraries in code: a zero
// field means its documented default, a Default… constant; a negative size
// or duration is an error from Validate, because a typo'd sign must not
// quietly become the default. A config's WithDefaults fills its zero fields
// with Default and keeps the negative ones for its Validate, which refuses
// them with RefuseNegative and bounds the wrong way round with
// RefuseCrossed.
package knob

import (
	"fmt"
	"time"
)

// Default sets *v to def if it is zero.
func Default[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Knob is one size or duration of a config, for RefuseNegative.
type Knob struct {
	name string
	v    any // as the error shows it
	neg  bool
}

// Signed is the knob of a config field named name whose value is v.
func Signed[T int | int64 | time.Duration](name string, v T) Knob { return Knob{name, v, v < 0} }

// RefuseNegative reports the first of knobs that is negative, naming the
// field after config, which names the library and the config type
// ("outbox: RelayConfig").
func RefuseNegative(config string, knobs ...Knob) error {
	for _, k := range knobs {
		if k.neg {
			return fmt.Errorf("%s.%s is negative (%v); leave it zero for the default", config, k.name, k.v)
		}
	}
	return nil
}

// RefuseCrossed reports a lower bound above its upper one, naming both
// fields after config, as RefuseNegative does.
func RefuseCrossed[T int | time.Duration](config, loName string, lo T, hiName string, hi T) error {
	if lo > hi {
		return fmt.Errorf("%s.%s (%v) exceeds %s (%v)", config, loName, lo, hiName, hi)
	}
	return nil
}
