package apperr

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Unauthorized is the code of a request without valid credentials (401). It
// is declared here, beside the HTTP mapping, because only the operator
// listener's bearer-token check returns it.
const Unauthorized Code = "unauthorized"

// RequestIDHeader carries a request's id: taken from the client when it is a
// short printable token (see ValidRequestID), generated otherwise, echoed in
// the response and written in every 5xx body and in the log line that has
// the internal error.
const RequestIDHeader = "X-Request-Id"

// MaxQuote is the most bytes of a client's input an error message quotes: a
// 900 KB field must not come back in the error body (nor fill the log).
const MaxQuote = 64

// maxMessage bounds any message written to a client, as a last guard for a
// message that quotes input without Quote.
const maxMessage = 1024

// ErrorBody is the JSON body of every error response, on the public API and
// on the operator endpoints alike.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		// RequestID is set on 5xx bodies: quote it to whoever reads the
		// service log, which has the internal error under the same id.
		RequestID string `json:"requestId,omitempty"`
	} `json:"error"`
}

// Status is the HTTP status of code; unknown codes are 500.
func Status(code Code) int {
	switch code {
	case Malformed:
		return http.StatusBadRequest
	case Unauthorized:
		return http.StatusUnauthorized
	case Invalid:
		return http.StatusUnprocessableEntity
	case NotFound, NoRoute:
		return http.StatusNotFound
	case Conflict:
		return http.StatusConflict
	case TooLarge:
		return http.StatusRequestEntityTooLarge
	case Unavailable:
		return http.StatusServiceUnavailable
	case MethodNotAllowed:
		return http.StatusMethodNotAllowed
	case UnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	}
	return http.StatusInternalServerError
}

// RetryAfterSeconds is the Retry-After of a 503 (Unavailable): long enough
// for a pool to redial, short enough that a client retrying on it is back
// soon after the database is.
const RetryAfterSeconds = 1

// WriteHTTP is the one place an error becomes an HTTP response, for the
// echo services (through httpserver's error handler) and for the
// standard-library operator handlers (outboxhttp, inboxhttp) alike. An
// *Error is answered with its code and message; an *http.MaxBytesError with
// 413; an Unavailable *Error with 503, its message, Retry-After and the
// request id, the whole error chain (the driver's cause) going to the log
// only; anything else is internal: logged with the request id, answered 500
// with that id and no detail, because an internal error string can reveal
// SQL, hosts or file paths.
func WriteHTTP(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	var body ErrorBody
	var mbe *http.MaxBytesError
	status := http.StatusInternalServerError
	if ae, ok := As(err); ok {
		status, body.Error.Code, body.Error.Message = Status(ae.Code), string(ae.Code), ae.Message
	} else if errors.As(err, &mbe) {
		status, body.Error.Code = http.StatusRequestEntityTooLarge, string(TooLarge)
		body.Error.Message = "request body is larger than the limit of " + strconv.FormatInt(mbe.Limit, 10) + " bytes"
	}
	switch {
	case status == http.StatusServiceUnavailable:
		// An outage, not a bug: a warning, and a body that says to retry.
		id := RequestID(w, r)
		logger.WarnContext(r.Context(), "request failed: a dependency is unavailable",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("request_id", id), slog.Any("error", err))
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		body.Error.RequestID = id
	case status >= 500:
		id := RequestID(w, r)
		logger.ErrorContext(r.Context(), "request failed",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("request_id", id), slog.Any("error", err))
		body.Error.Code, body.Error.RequestID = "internal", id
		body.Error.Message = "internal error; see the service log for request id " + id
	}
	if len(body.Error.Message) > maxMessage {
		body.Error.Message = truncate(body.Error.Message, maxMessage) + "…"
	}
	WriteJSON(w, status, body)
}

// WriteJSON writes v as the JSON body of a response with status. A write
// error means the client went away; there is no one left to tell.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	// The bodies are JSON for programs and people, never HTML: "<ADMIN_TOKEN>"
	// reads better than "\u003cADMIN_TOKEN\u003e", and the Content-Type
	// keeps a browser from taking it for markup.
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// RequestID returns the id of the request being answered on w: the one the
// request-id middleware already set on the response, else the client's if
// valid, else a new one; either way it is set on the response.
func RequestID(w http.ResponseWriter, r *http.Request) string {
	if id := w.Header().Get(RequestIDHeader); id != "" {
		return id
	}
	id := r.Header.Get(RequestIDHeader)
	if !ValidRequestID(id) {
		id = NewRequestID()
	}
	w.Header().Set(RequestIDHeader, id)
	return id
}

// ValidRequestID reports whether a client's request id may be used as ours:
// 1 to 128 bytes of printable ASCII, so that it is safe in logs, headers and
// a Postgres text column (it becomes an event's correlation id).
func ValidRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// NewRequestID returns a random 128-bit id in hex.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Quote returns s quoted for an error message, cut to MaxQuote bytes (at a
// rune boundary) with a note of its full length when longer.
func Quote(s string) string {
	if len(s) <= MaxQuote {
		return strconv.Quote(s)
	}
	return strconv.Quote(truncate(s, MaxQuote)) + "… (" + strconv.Itoa(len(s)) + " bytes)"
}

// CheckText refuses what Postgres refuses in a text value (invalid UTF-8
// and NUL, SQLSTATE 22021) as the caller's fault, before it reaches the
// database and becomes a 500. what names the value in the message.
func CheckText(what, s string) error {
	if !utf8.ValidString(s) {
		return Errorf(Malformed, "%s is not valid UTF-8", what)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return Errorf(Malformed, "%s contains a NUL character", what)
	}
	return nil
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
