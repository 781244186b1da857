package httpserver

import (
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/strictjson"
)

// DecodeJSON reads exactly one JSON object from body into v, strictly (see
// package strictjson): field names must match exactly, unknown fields,
// trailing data, invalid UTF-8 and NUL characters are refused. Errors are
// apperr.Malformed, except the body limit's own error, which the error
// handler maps to 413.
func DecodeJSON(body io.Reader, v any) error {
	return strictjson.Decode(body, v)
}

// RequireJSON refuses a request whose Content-Type says its body is not JSON
// (415, apperr.UnsupportedMediaType): a client sending text/plain or a form
// has a bug worth hearing about, even when the bytes happen to parse.
// application/json and the +json types are taken, with any parameters
// (charset); a request without a Content-Type is read as JSON, since it
// declares nothing else.
func RequireJSON(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		return nil
	}
	return apperr.Errorf(apperr.UnsupportedMediaType, "Content-Type must be application/json, got %s", apperr.Quote(ct))
}
