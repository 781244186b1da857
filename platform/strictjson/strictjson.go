// Package strictjson decodes a request body the way an API should and
// encoding/json alone does not: exactly one JSON value, field names matched
// exactly (encoding/json matches them case-insensitively, so {"CUSTOMERID":…}
// would fill CustomerID), a key given twice refused (encoding/json keeps the
// last one), unknown fields and trailing data refused, and no
// string Postgres would refuse (invalid UTF-8, NUL). Every refusal is an
// apperr.Malformed whose message quotes at most apperr.MaxQuote bytes of the
// input. It uses the standard library only, so the operator handlers
// (outboxhttp, inboxhttp) share it with the echo services.
package strictjson

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/onceflow/onceflow/platform/apperr"
)

// Decode reads all of r and decodes it into v (a pointer). A read error is
// returned as is (wrapped), so a body limit's own error (*http.MaxBytesError
// or echo's 413) keeps its status.
func Decode(r io.Reader, v any) error {
	data, err := io.ReadAll(r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return fmt.Errorf("reading request body: %w", err)
	}
	return Unmarshal(data, v)
}

// Unmarshal is Decode for a body already read.
func Unmarshal(data []byte, v any) error {
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
		return malformed(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return apperr.Errorf(apperr.Malformed, "request body has data after the JSON object")
	}
	// encoding/json keeps the last of two equal keys without a word, so
	// {"amountCents":1999,"amountCents":1} would charge 1: one reading only.
	if err := noDuplicateKeys(json.NewDecoder(bytes.NewReader(data)), ""); err != nil {
		return err
	}
	var raw any
	if err := json.Unmarshal(data, &raw); err != nil {
		return malformed(err) // not reached: dec.Decode accepted the same bytes
	}
	return check(raw, reflect.TypeOf(v), "")
}

// noDuplicateKeys reads one JSON value from dec (already known to be valid)
// and refuses an object that has a key twice, naming its path.
func noDuplicateKeys(dec *json.Decoder, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return malformed(err)
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return malformed(err)
			}
			key, _ := k.(string)
			if seen[key] {
				return apperr.Errorf(apperr.Malformed, "field %s appears twice; send each field once", apperr.Quote(join(path, key)))
			}
			seen[key] = true
			if err := noDuplicateKeys(dec, join(path, key)); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if err := noDuplicateKeys(dec, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
	}
	if err != nil {
		return malformed(err)
	}
	return nil
}

// malformed turns a decoding error into a message that names the field and
// the expected type, never the value (which can be huge).
func malformed(err error) error {
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
			field, kind(typ.Type), typ.Value)
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

func kind(t reflect.Type) string {
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
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
)

// check walks the generic decoding of the body beside the target type: every
// object key must be a field's exact JSON name, and no string (key or value)
// may hold a NUL. Values decoded by their own UnmarshalJSON/UnmarshalText
// (uuid.UUID, time.Time) are checked for NUL only.
func check(raw any, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	own := t == nil || t.Kind() == reflect.Interface ||
		reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler)
	switch x := raw.(type) {
	case string:
		if strings.IndexByte(x, 0) >= 0 {
			return apperr.Errorf(apperr.Malformed, "%s contains a NUL character", name(path))
		}
	case []any:
		var elem reflect.Type
		if !own && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i, e := range x {
			if err := check(e, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case map[string]any:
		var fields map[string]reflect.Type
		if !own && t.Kind() == reflect.Struct {
			fields = fieldsOf(t)
		}
		for k, e := range x {
			if strings.IndexByte(k, 0) >= 0 {
				return apperr.Errorf(apperr.Malformed, "%s has a field name with a NUL character", name(path))
			}
			var et reflect.Type
			switch {
			case fields != nil:
				ft, ok := fields[k]
				if !ok {
					return apperr.Errorf(apperr.Malformed, "unknown field %s (field names are case-sensitive)", apperr.Quote(join(path, k)))
				}
				et = ft
			case !own && t.Kind() == reflect.Map:
				et = t.Elem()
			}
			if err := check(e, et, join(path, k)); err != nil {
				return err
			}
		}
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func name(path string) string {
	if path == "" {
		return "the body"
	}
	return apperr.Quote(path)
}

var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// fieldsOf maps the exact JSON names of t's fields to their types, following
// encoding/json's rules for tags, unexported fields and embedded structs.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	out := map[string]reflect.Type{}
	for _, f := range reflect.VisibleFields(t) {
		if len(f.Index) > 1 && !promoted(t, f.Index) {
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
	fieldCache.Store(t, out)
	return out
}

// promoted reports whether the field at index is reached through untagged
// embedded structs only, which is when encoding/json promotes it.
func promoted(t reflect.Type, index []int) bool {
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
