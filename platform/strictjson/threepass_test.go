package strictjson

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/onceflow/onceflow/platform/apperr"
)

// threePassUnmarshal is Unmarshal as it was before the one-pass decoder: a
// strict encoding/json decode, a token walk for duplicate keys, and a
// generic decode walked for exact names and NUL. It is kept here as the
// benchmark's same-run baseline and as the reference the one-pass decoder
// is compared with (TestAgreesWithThreePass, FuzzAgreesWithThreePass).
func threePassUnmarshal(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return apperr.Errorf(apperr.Malformed, "request body is empty; want a JSON object")
	}
	// encoding/json would silently turn invalid UTF-8 into U+FFFD.
	if !utf8.Valid(data) {
		return apperr.Errorf(apperr.Malformed, "request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return tpMalformed(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return apperr.Errorf(apperr.Malformed, "request body has data after the JSON object")
	}
	// encoding/json keeps the last of two equal keys without a word, so
	// {"amountCents":1999,"amountCents":1} would charge 1: one reading only.
	if err := tpNoDuplicateKeys(json.NewDecoder(bytes.NewReader(data)), ""); err != nil {
		return err
	}
	var raw any
	if err := json.Unmarshal(data, &raw); err != nil {
		return tpMalformed(err) // not reached: dec.Decode accepted the same bytes
	}
	return tpCheck(raw, reflect.TypeOf(v), "")
}

// tpNoDuplicateKeys reads one JSON value from dec (already known to be valid)
// and refuses an object that has a key twice, naming its path.
func tpNoDuplicateKeys(dec *json.Decoder, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return tpMalformed(err)
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return tpMalformed(err)
			}
			key, _ := k.(string)
			if seen[key] {
				return apperr.Errorf(apperr.Malformed, "field %s appears twice; send each field once", apperr.Quote(tpJoin(path, key)))
			}
			seen[key] = true
			if err := tpNoDuplicateKeys(dec, tpJoin(path, key)); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if err := tpNoDuplicateKeys(dec, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
	}
	if err != nil {
		return tpMalformed(err)
	}
	return nil
}

// tpMalformed turns a decoding error into a message that names the field and
// the expected type, never the value (which can be huge).
func tpMalformed(err error) error {
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &syn):
		return apperr.Errorf(apperr.Malformed, "request body is not valid JSON (at byte %d): %s", syn.Offset, syn.Error())
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "the body"
		}
		return apperr.Errorf(apperr.Malformed, "request body is not valid JSON for this endpoint: %s must be %s, got a JSON %s",
			field, tpKind(typ.Type), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return apperr.Errorf(apperr.Malformed, "request body is not valid JSON: it ends in the middle of a value")
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return apperr.Errorf(apperr.Malformed, "unknown field %s", apperr.Quote(strings.Trim(name, `"`)))
	}
	// Errors of a field's own UnmarshalJSON / UnmarshalText (a bad UUID or
	// time) may quote the value: cut them.
	if len(msg) > 2*apperr.MaxQuote {
		msg = msg[:2*apperr.MaxQuote] + "…"
	}
	return apperr.Errorf(apperr.Malformed, "request body is not valid JSON for this endpoint: %s", strings.ToValidUTF8(msg, "?"))
}

func tpKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "a " + t.String()
}

var (
	tpTextUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	tpJSONUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
)

// tpCheck walks the generic decoding of the body beside the target type: every
// object key must be a field's exact JSON name, and no string (key or value)
// may hold a NUL. Values decoded by their own UnmarshalJSON/UnmarshalText
// (uuid.UUID, time.Time) are checked for NUL only.
func tpCheck(raw any, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	own := t == nil || t.Kind() == reflect.Interface ||
		reflect.PointerTo(t).Implements(tpJSONUnmarshaler) || reflect.PointerTo(t).Implements(tpTextUnmarshaler)
	switch x := raw.(type) {
	case string:
		if strings.IndexByte(x, 0) >= 0 {
			return apperr.Errorf(apperr.Malformed, "%s contains a NUL character", tpName(path))
		}
	case []any:
		var elem reflect.Type
		if !own && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i, e := range x {
			if err := tpCheck(e, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case map[string]any:
		var fields map[string]reflect.Type
		if !own && t.Kind() == reflect.Struct {
			fields = tpFieldsOf(t)
		}
		for k, e := range x {
			if strings.IndexByte(k, 0) >= 0 {
				return apperr.Errorf(apperr.Malformed, "%s has a field name with a NUL character", tpName(path))
			}
			var et reflect.Type
			switch {
			case fields != nil:
				ft, ok := fields[k]
				if !ok {
					return apperr.Errorf(apperr.Malformed, "unknown field %s (field names are case-sensitive)", apperr.Quote(tpJoin(path, k)))
				}
				et = ft
			case !own && t.Kind() == reflect.Map:
				et = t.Elem()
			}
			if err := tpCheck(e, et, tpJoin(path, k)); err != nil {
				return err
			}
		}
	}
	return nil
}

func tpJoin(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func tpName(path string) string {
	if path == "" {
		return "the body"
	}
	return apperr.Quote(path)
}

var tpFieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// tpFieldsOf maps the exact JSON names of t's fields to their types, following
// encoding/json's rules for tags, unexported fields and embedded structs.
func tpFieldsOf(t reflect.Type) map[string]reflect.Type {
	if f, ok := tpFieldCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	out := map[string]reflect.Type{}
	for _, f := range reflect.VisibleFields(t) {
		if len(f.Index) > 1 && !tpPromoted(t, f.Index) {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		n, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && n == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				continue // its fields are listed by VisibleFields
			}
		}
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		if n == "" {
			n = f.Name
		}
		out[n] = f.Type
	}
	tpFieldCache.Store(t, out)
	return out
}

// tpPromoted reports whether the field at index is reached through untagged
// embedded structs only, which is when encoding/json promotes it.
func tpPromoted(t reflect.Type, index []int) bool {
	for _, i := range index[:len(index)-1] {
		f := t.Field(i)
		if !f.Anonymous {
			return false
		}
		if n, _, _ := strings.Cut(f.Tag.Get("json"), ","); n != "" {
			return false
		}
		t = f.Type
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
	}
	return true
}

// ThreePassUnmarshal is threePassUnmarshal for the package's external tests.
var ThreePassUnmarshal = threePassUnmarshal
