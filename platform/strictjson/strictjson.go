// Package strictjson decodes a request body the way an API should and
// encoding/json alone does not: exactly one JSON value, field names matched
// exactly (encoding/json matches them case-insensitively, so {"CUSTOMERID":…}
// would fill CustomerID), a key given twice refused (encoding/json keeps the
// last one), unknown fields and trailing data refused, and no
// string Postgres would refuse (invalid UTF-8, NUL). Every refusal is an
// apperr.Malformed whose message quotes at most apperr.MaxQuote bytes of the
// input. The operator handlers (outboxhttp, inboxhttp) share it with the echo
// services.
//
// It reads the body once, with github.com/go-json-experiment/json (the
// module that mirrors Go's encoding/json/v2), which makes every check above
// but the NUL one while it decodes. Go types keep encoding/json's meanings
// (times, numbers in an interface as json.Number, and so on); the one input
// it refuses that encoding/json took is an escaped lone surrogate such as
// "\ud800", which encoding/json silently turned into U+FFFD, like invalid
// UTF-8.
package strictjson

import (
	"bytes"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	json "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"

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

// options give Go types encoding/json's meanings (what a time.Time accepts,
// a byte array as numbers, and so on: a team moving a struct to this package
// sees no difference there) and then everything this package is for: exact
// names, unknown members, a name twice and invalid UTF-8 all refused.
// Legacy error reporting stays off: it would validate the whole value before
// decoding it (a second pass) and drop the JSON pointer the messages name.
var options = json.JoinOptions(
	jsonv1.DefaultOptionsV1(),
	jsonv1.ReportErrorsWithLegacySemantics(false),
	json.MatchCaseInsensitiveNames(false),
	json.RejectUnknownMembers(true),
	jsontext.AllowDuplicateNames(false),
	jsontext.AllowInvalidUTF8(false),
	json.WithUnmarshalers(json.UnmarshalFromFunc(numberInInterface)),
)

// numberInInterface decodes a number into an empty interface as a
// json.Number, as encoding/json's UseNumber did: a float64 would round an id
// or an amount above 2^53 without a word. An object or array is decoded here
// too, so that the numbers inside it come back through this function.
func numberInInterface(dec *jsontext.Decoder, v *any) error {
	if *v != nil {
		return errors.ErrUnsupported
	}
	switch dec.PeekKind() {
	case '0':
		tok, err := dec.ReadToken()
		if err != nil {
			return err
		}
		*v = stdjson.Number(tok.String())
	case '{':
		m := map[string]any{}
		if err := json.UnmarshalDecode(dec, &m); err != nil {
			return err
		}
		*v = m
	case '[':
		s := []any{}
		if err := json.UnmarshalDecode(dec, &s); err != nil {
			return err
		}
		*v = s
	default:
		return errors.ErrUnsupported
	}
	return nil
}

// nulEscape is the only way a NUL can be in valid JSON text: a raw NUL
// byte is a syntax error.
var nulEscape = []byte(`\u0000`)

// Unmarshal is Decode for a body already read.
func Unmarshal(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return apperr.Errorf(apperr.Malformed, "request body is empty; want a JSON object")
	}
	if err := json.Unmarshal(data, v, options); err != nil {
		return refusal(data, err)
	}
	// A byte scan, not a second decode: a body that has the escape (or a
	// `\\u0000`, which is no NUL) is walked to find and name the string.
	if bytes.Contains(data, nulEscape) {
		return findNUL(data)
	}
	return nil
}

// refusal turns a decoding error into a message that names the field and
// the expected type, never the value (which can be huge). It runs only for
// a refused body, so it may read the body again to name a field.
func refusal(data []byte, err error) error {
	if !utf8.Valid(data) {
		// Whatever the decoder met first, this is the whole story.
		return apperr.Errorf(apperr.Malformed, "request body is not valid UTF-8")
	}
	var (
		syn *jsontext.SyntacticError
		sem *json.SemanticError
	)
	switch {
	case errors.As(err, &syn):
		switch {
		case syn.Err == jsontext.ErrDuplicateName:
			return apperr.Errorf(apperr.Malformed, "field %s appears twice; send each field once", apperr.Quote(pathOf(data, syn.JSONPointer)))
		case errors.Is(syn.Err, io.ErrUnexpectedEOF):
			return apperr.Errorf(apperr.Malformed, "request body is not valid JSON: it ends in the middle of a value")
		case oneValueThenMore(data):
			return apperr.Errorf(apperr.Malformed, "request body has data after the JSON object")
		}
		// The reason quotes one character (or escape) at most.
		return apperr.Errorf(apperr.Malformed, "request body is not valid JSON (at byte %d): %s", syn.ByteOffset, cut(syn.Err))
	case errors.As(err, &sem):
		field, path := "the body", ""
		if sem.JSONPointer != "" {
			path = pathOf(data, sem.JSONPointer)
			field = label(path)
		}
		switch {
		case sem.Err == json.ErrUnknownName:
			msg := "unknown field " + apperr.Quote(path)
			if hasFieldFolded(sem.GoType, sem.JSONPointer.LastToken()) {
				msg += " (field names are case-sensitive)"
			}
			return apperr.Errorf(apperr.Malformed, "%s", msg)
		case sem.JSONKind != 0 && sem.GoType != nil && sem.Err == nil:
			return apperr.Errorf(apperr.Malformed, "request body is not valid JSON for this endpoint: %s must be %s, got a JSON %s",
				field, kind(sem.GoType), jsonKind(sem.JSONKind))
		case sem.JSONKind == '0' && sem.GoType != nil:
			// A number the Go type cannot hold: 1.5 or 1e400 for an int.
			return apperr.Errorf(apperr.Malformed, "request body is not valid JSON for this endpoint: %s must be %s, got the JSON number %s",
				field, kind(sem.GoType), apperr.Quote(string(sem.JSONValue)))
		case sem.Err != nil:
			// A field's own UnmarshalJSON / UnmarshalText, or a time: its
			// error may quote the value, so it is cut.
			return apperr.Errorf(apperr.Malformed, "request body is not valid JSON for this endpoint: %s: %s", field, cut(sem.Err))
		}
	}
	return apperr.Errorf(apperr.Malformed, "request body is not valid JSON for this endpoint: %s", cut(err))
}

// cut bounds an error's text: errors of a field's own methods may quote the
// value.
func cut(err error) string {
	msg := err.Error()
	if len(msg) > 2*apperr.MaxQuote {
		msg = msg[:2*apperr.MaxQuote] + "…"
	}
	return strings.ToValidUTF8(msg, "?")
}

// oneValueThenMore reports whether data starts with one complete JSON value:
// a syntax error after it is data after the object.
func oneValueThenMore(data []byte) bool {
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true))
	_, err := dec.ReadValue()
	return err == nil
}

// pathOf spells ptr, a JSON pointer into data, the way the messages name a
// field: inner.name, list[1].name. The pointer alone cannot tell an array
// index from an object key that is all digits, so data is read along it.
func pathOf(data []byte, ptr jsontext.Pointer) string {
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true))
	var path string
	for tok := range ptr.Tokens() {
		switch dec.PeekKind() {
		case '[':
			path += "[" + tok + "]"
			i, err := strconv.Atoi(tok)
			if _, err2 := dec.ReadToken(); err != nil || err2 != nil {
				return path
			}
			for ; i > 0; i-- {
				if dec.SkipValue() != nil {
					return path
				}
			}
		case '{':
			path = join(path, tok)
			if _, err := dec.ReadToken(); err != nil {
				return path
			}
			for dec.PeekKind() == '"' {
				name, err := dec.ReadToken()
				if err != nil || name.String() == tok {
					break
				}
				if dec.SkipValue() != nil {
					return path
				}
			}
		default:
			return join(path, tok)
		}
	}
	return path
}

// findNUL reads data (a body already decoded, so valid) and refuses the
// first string, key or value, that holds a NUL, naming where it is.
func findNUL(data []byte) error {
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true))
	return nulIn(dec, "")
}

func nulIn(dec *jsontext.Decoder, path string) error {
	tok, err := dec.ReadToken()
	if err != nil {
		return notReached() // the body was decoded
	}
	switch tok.Kind() {
	case '"':
		if strings.IndexByte(tok.String(), 0) >= 0 {
			return apperr.Errorf(apperr.Malformed, "%s contains a NUL character", name(path))
		}
	case '{':
		for dec.PeekKind() == '"' {
			k, err := dec.ReadToken()
			if err != nil {
				return notReached()
			}
			key := k.String()
			if strings.IndexByte(key, 0) >= 0 {
				return apperr.Errorf(apperr.Malformed, "%s has a field name with a NUL character", name(path))
			}
			if err := nulIn(dec, join(path, key)); err != nil {
				return err
			}
		}
		_, err = dec.ReadToken() // '}'
	case '[':
		for i := 0; dec.PeekKind() != ']' && dec.PeekKind() != 0; i++ {
			if err := nulIn(dec, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		_, err = dec.ReadToken() // ']'
	}
	if err != nil {
		return notReached()
	}
	return nil
}

// notReached answers a body that decoded but cannot be read again.
func notReached() error {
	return apperr.Errorf(apperr.Malformed, "request body is not valid JSON")
}

// hasFieldFolded reports whether struct type t has a field whose JSON name
// equals name but for case, which is worth a hint in the message.
func hasFieldFolded(t reflect.Type, name string) bool {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return false
	}
	for _, f := range reflect.VisibleFields(t) {
		n, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if n == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		if ft := f.Type; f.Anonymous && n == "" && (ft.Kind() == reflect.Struct || ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct) {
			continue // inlined: its fields are listed by VisibleFields
		}
		if n == "" {
			n = f.Name
		}
		if strings.EqualFold(n, name) {
			return true
		}
	}
	return false
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
	case reflect.Pointer:
		return kind(t.Elem())
	}
	return "a " + t.String()
}

func jsonKind(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 'f', 't':
		return "bool"
	case '"':
		return "string"
	case '0':
		return "number"
	case '[':
		return "array"
	case '{':
		return "object"
	}
	return "value"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// label names a field in a message: as is when it is a short plain name (as
// the struct's own names are), quoted and cut when a map key made it long or
// odd.
func label(path string) string {
	if len(path) > apperr.MaxQuote || strings.ContainsFunc(path, func(r rune) bool { return r <= ' ' || r == '"' || r > '~' }) {
		return apperr.Quote(path)
	}
	return path
}

func name(path string) string {
	if path == "" {
		return "the body"
	}
	return apperr.Quote(path)
}
