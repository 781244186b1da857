package engine

import (
	"errors"
	"fmt"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/pgerr"
)

// ErrPermanent marks a handler error that no retry can fix.
var ErrPermanent = errors.New("permanent failure")

// Permanent wraps err so the consumer dead-letters instead of retrying.
func Permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// ErrAbandoned ends the handling of a message this member no longer owns
// (its generation was dropped) or may no longer work on (the shutdown grace
// is over); the message is fetched again by whoever owns its partition.
var ErrAbandoned = errors.New("message abandoned")

// CrashError is a crash point firing: the one error that stops Run.
type CrashError struct{ Err error }

func (e *CrashError) Error() string { return e.Err.Error() }

func (e *CrashError) Unwrap() error { return e.Err }

// The database errors the dispatcher and the appliers decide on. Each
// applier translates the driver's errors (pgx, SQLSTATE) of the SQL it runs
// into these names (dbErrors.Translate), beside that SQL; isOutage and
// isPermanent also classify what has no name yet, such as a handler's own
// statements.
var (
	// errDBUnavailable: the database could not be reached or could not
	// serve (pgerr.IsUnavailable). Waited out, never the message's fault.
	errDBUnavailable = errors.New("inbox database unavailable")
	// errDBRefused: Postgres refused the data itself (pgerr.IsPermanent:
	// SQLSTATE class 22 or 54). No retry can help: the message is
	// dead-lettered.
	errDBRefused = errors.New("inbox database refused the data")

	DBErrors = pgerr.StoreErrors{Unavailable: errDBUnavailable, Invalid: errDBRefused}
)

// IsOutage reports whether err is the database being unreachable rather
// than anything about the message: it is waited out, never counted as an
// attempt, and never dead-letters the message.
func IsOutage(err error) bool { return errors.Is(err, errDBUnavailable) || pgerr.IsUnavailable(err) }

// IsPermanent reports whether no retry can make err go away: the handler
// said so (Permanent), the event broke its contract (event.ErrInvalid), or
// Postgres refused the data itself (pgerr.IsPermanent: SQLSTATE class 22,
// a NUL byte in a text column, say, or class 54).
func IsPermanent(err error) bool {
	return errors.Is(err, ErrPermanent) || errors.Is(err, event.ErrInvalid) ||
		errors.Is(err, errDBRefused) || pgerr.IsPermanent(err)
}
