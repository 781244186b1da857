package pgerr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/pgerr"
)

func TestErrorClasses(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("inserting: %w", &pgconn.PgError{Code: code}) }
	for _, tt := range []struct {
		name                   string
		err                    error
		permanent, unavailable bool
	}{
		{"nil", nil, false, false},
		{"invalid byte sequence (NUL in text)", pg("22021"), true, false},
		{"invalid text representation", pg("22P02"), true, false},
		{"string too long", pg("22001"), true, false},
		{"numeric out of range", pg("22003"), true, false},
		{"program limit exceeded", pg("54000"), true, false},
		{"serialization failure", pg("40001"), false, false},
		{"deadlock", pg("40P01"), false, false},
		{"unique violation", pg("23505"), false, false},
		{"admin shutdown", pg("57P01"), false, true},
		{"cannot connect now", pg("57P03"), false, true},
		{"connection failure", pg("08006"), false, true},
		{"too many connections", pg("53300"), false, true},
		{"query canceled", pg("57014"), false, false},
		{"connect error", &pgconn.ConnectError{}, false, true},
		{"net error", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, false, true},
		{"connection reset", fmt.Errorf("reading: %w", syscall.ECONNRESET), false, true},
		{"eof", fmt.Errorf("reading: %w", io.EOF), false, true},
		{"pool acquire timeout", fmt.Errorf("acquiring: %w", context.DeadlineExceeded), false, true},
		{"closed pool", errors.New("closed pool"), false, true},
		{"conn closed", errors.New("conn closed"), false, true},
		{"canceled", context.Canceled, false, false},
		{"handler error", errors.New("no such customer"), false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := pgerr.IsPermanent(tt.err); got != tt.permanent {
				t.Errorf("IsPermanent(%v) = %v, want %v", tt.err, got, tt.permanent)
			}
			if got := pgerr.IsUnavailable(tt.err); got != tt.unavailable {
				t.Errorf("IsUnavailable(%v) = %v, want %v", tt.err, got, tt.unavailable)
			}
		})
	}
}

func TestStoreErrorsTranslate(t *testing.T) {
	t.Parallel()
	var (
		errNotFound    = errors.New("not found")
		errDuplicate   = errors.New("duplicate")
		errUnavailable = errors.New("unavailable")
		errInvalid     = errors.New("invalid")
	)
	names := pgerr.StoreErrors{NotFound: errNotFound, Duplicate: errDuplicate, Unavailable: errUnavailable, Invalid: errInvalid}
	pg := func(code string) error { return &pgconn.PgError{Code: code} }
	for _, tt := range []struct {
		name     string
		err      error
		want     error // nil: no name
		keepsPgx bool
	}{
		{"no rows", fmt.Errorf("scanning: %w", pgx.ErrNoRows), errNotFound, false},
		{"unique violation", pg("23505"), errDuplicate, true},
		{"closed pool", errors.New("closed pool"), errUnavailable, false},
		{"admin shutdown", pg("57P01"), errUnavailable, true},
		{"NUL in text", pg("22021"), errInvalid, true},
		{"check violation", pg("23514"), nil, true},
		{"already named", fmt.Errorf("inner: %w: %w", errDuplicate, pg("23505")), errDuplicate, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := names.Translate("reading thing", tt.err)
			if !strings.HasPrefix(got.Error(), "reading thing: ") && !strings.HasPrefix(got.Error(), "inner: ") {
				t.Errorf("Translate = %q, want the op in front", got)
			}
			for _, name := range []error{errNotFound, errDuplicate, errUnavailable, errInvalid} {
				if errors.Is(got, name) != (name == tt.want) {
					t.Errorf("errors.Is(%q, %v) = %v", got, name, !(name == tt.want))
				}
			}
			var pgErr *pgconn.PgError
			if errors.As(got, &pgErr) != tt.keepsPgx {
				t.Errorf("the driver's error is in the chain: %v, want %v", !tt.keepsPgx, tt.keepsPgx)
			}
			if errors.Is(got, pgx.ErrNoRows) {
				t.Error("pgx.ErrNoRows left in the chain")
			}
		})
	}
	if (pgerr.StoreErrors{}).Translate("x", nil) != nil {
		t.Error("Translate(nil) is not nil")
	}
}
