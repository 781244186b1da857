package pgerr

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// IsPermanent reports whether err is Postgres refusing the data itself, so
// the same statement with the same input can never succeed: a data
// exception (SQLSTATE class 22: invalid byte sequence 22021, bad text
// representation 22P02, value too long 22001, out of range 22003, …), a
// program limit (class 54: 54000, 54001 statement too complex, 54011 too
// many columns). Connection errors,
// serialization failures (40001, 40P01), admin shutdowns (57P01), class 08,
// timeouts and constraint violations (class 23, which can clear when other
// rows change) are not permanent.
func IsPermanent(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch {
	case strings.HasPrefix(pgErr.Code, "22"):
		return true
	case strings.HasPrefix(pgErr.Code, "54"):
		return true
	}
	return false
}

// IsUnavailable reports whether err says the database could not be reached
// or could not serve the request for reasons outside the statement: the
// connection failed or broke (SQLSTATE class 08, a network error, io.EOF),
// the server is shutting down or starting (57P01, 57P02, 57P03), it is out
// of connections or resources (53xxx), or waiting for a connection from the
// pool timed out. Such failures are outages to wait out, never a message's
// fault. A context that ended is not an outage: callers check ctx.Err().
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), strings.HasPrefix(pgErr.Code, "53"):
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03":
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	if pgconn.Timeout(err) && !errors.Is(err, context.Canceled) {
		return true // a pool acquire or dial that ran out of time
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	// pgx reports a connection that broke mid-statement, and a pool that was
	// closed, with these messages and no typed error.
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "closed pool") ||
		strings.Contains(msg, "failed to connect") || strings.Contains(msg, "unexpected EOF")
}
