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
	"reflect"
	"time"
)

// Default sets *v to def if it is zero.
func Default[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// RefuseNegative reports the first field of config, a config struct, that
// is a size or a duration (of type int or time.Duration) and negative,
// naming it after name, the library and the config type ("outbox:
// RelayConfig"). It reads every such field, so a knob added to a config is
// checked without being listed; a field whose negative values mean
// something (kafka-go's StartOffset, an int64) has another type, and its
// config checks it itself, as it checks embedded configs (not looked at).
func RefuseNegative(name string, config any) error {
	v := reflect.ValueOf(config)
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if !f.IsExported() || (f.Type != sizeType && f.Type != durationType) {
			continue
		}
		if n := v.Field(i); n.Int() < 0 {
			return fmt.Errorf("%s.%s is negative (%v); leave it zero for the default", name, f.Name, n.Interface())
		}
	}
	return nil
}

var (
	sizeType     = reflect.TypeFor[int]()
	durationType = reflect.TypeFor[time.Duration]()
)

// RefuseCrossed reports a lower bound above its upper one, naming both
// fields after config, as RefuseNegative does.
func RefuseCrossed[T int | time.Duration](config, loName string, lo T, hiName string, hi T) error {
	if lo > hi {
		return fmt.Errorf("%s.%s (%v) exceeds %s (%v)", config, loName, lo, hiName, hi)
	}
	return nil
}
