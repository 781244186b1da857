// Package apperr is the one coded error type application code returns when
// the caller, not the system, is at fault, or when a dependency is away for a
// while (Unavailable). The HTTP layer maps each Code to a status in exactly
// one place (WriteHTTP, behind httpserver's error handler); everything else
// is an internal error whose details stay in the log.
package apperr

import (
	"errors"
	"fmt"
)

// Code classifies an application error.
type Code string

// The codes, with the HTTP status they map to (see Status).
const (
	Malformed Code = "malformed" // 400: the request cannot be parsed
	Invalid   Code = "invalid"   // 422: parsed, but breaks a rule
	NotFound  Code = "not_found" // 404
	Conflict  Code = "conflict"  // 409: valid, but clashes with current state
	TooLarge  Code = "too_large" // 413
	// Unavailable: a dependency (the service's database) cannot be reached
	// now; the same request may succeed later. 503 with Retry-After.
	Unavailable Code = "unavailable"
	// NoRoute: no route has this path (404). Not NotFound, which says the
	// route exists and the thing it names does not: a client that reads
	// not_found as "never booked" (the shim asking the third party) must
	// not read a wrong base URL the same way.
	NoRoute Code = "no_route"
	// MethodNotAllowed: the route exists, not with this method (405).
	MethodNotAllowed Code = "method_not_allowed"
	// UnsupportedMediaType: the body is not in a format the route takes,
	// such as text/plain where JSON is expected (415).
	UnsupportedMediaType Code = "unsupported_media_type"
)

// Error is an application error with a message safe to show the caller.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf returns an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// As returns the *Error in err's chain, if any.
func As(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
