package pgerr

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// UniqueViolation is SQLSTATE 23505: an insert or update collided with a
// unique index or primary key.
const UniqueViolation = "23505"

// StoreErrors are one store's named errors, one per class of driver error it
// cares about; Translate puts them in an error's chain so that the code
// above the store matches them with errors.Is and never sees pgx or a
// SQLSTATE. A nil field leaves that class unnamed.
type StoreErrors struct {
	// NotFound replaces pgx.ErrNoRows.
	NotFound error
	// Duplicate marks a unique violation (SQLSTATE 23505).
	Duplicate error
	// Unavailable marks an outage (IsUnavailable): the database could not be
	// reached or could not serve; the same call may succeed later.
	Unavailable error
	// Invalid marks data Postgres refuses (IsPermanent): the same call with
	// the same input never succeeds.
	Invalid error
}

// Translate returns err, from the statement described by op, with the named
// error of its class in its chain. The driver's error stays in the chain
// behind it, so that the log has the cause and outage and poison checks
// (IsUnavailable, IsPermanent) further up still see it; pgx.ErrNoRows is
// replaced, since it says nothing the name does not. An error that already
// carries one of the names (translated by an inner call) and nil are
// returned as they are.
func (n StoreErrors) Translate(op string, err error) error {
	if err == nil {
		return nil
	}
	for _, name := range []error{n.NotFound, n.Duplicate, n.Unavailable, n.Invalid} {
		if name != nil && errors.Is(err, name) {
			return err
		}
	}
	var pgErr *pgconn.PgError
	switch {
	case n.NotFound != nil && errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%s: %w", op, n.NotFound)
	case n.Duplicate != nil && errors.As(err, &pgErr) && pgErr.Code == UniqueViolation:
		return fmt.Errorf("%s: %w: %w", op, n.Duplicate, err)
	case n.Unavailable != nil && IsUnavailable(err):
		return fmt.Errorf("%s: %w: %w", op, n.Unavailable, err)
	case n.Invalid != nil && IsPermanent(err):
		return fmt.Errorf("%s: %w: %w", op, n.Invalid, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}
