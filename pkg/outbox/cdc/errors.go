package cdc

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// SQLSTATEs the relay acts on.
const (
	duplicateObject = "42710" // CREATE of a publication or slot that exists
	objectInUse     = "55006" // a replication slot another connection streams from
)

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

func isDuplicateObject(err error) bool { return sqlState(err) == duplicateObject }

func isObjectInUse(err error) bool { return sqlState(err) == objectInUse }

// sqlState is the SQLSTATE of the Postgres error in err's chain, "" if none.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// serverError is the error a replication stream's ErrorResponse reports.
func serverError(m *pgproto3.ErrorResponse) error { return pgconn.ErrorResponseToPgError(m) }
