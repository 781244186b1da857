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
