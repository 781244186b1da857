package httpserver

import (
	"io"

	"github.com/onceflow/onceflow/pkg/platform/strictjson"
)

// DecodeJSON reads exactly one JSON object from body into v, strictly (see
// package strictjson): field names must match exactly, unknown fields,
// trailing data, invalid UTF-8 and NUL characters are refused. Errors are
// apperr.Malformed, except the body limit's own error, which the error
// handler maps to 413.
func DecodeJSON(body io.Reader, v any) error {
	return strictjson.Decode(body, v)
}
