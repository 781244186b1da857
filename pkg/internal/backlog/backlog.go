// Package backlog is the one backlog read of both libraries: how many rows
// of one status are older than an age, when the oldest began, and the ids of
// the oldest few. Which rows (the statements) and what the report holds are
// each library's: outboxadmin.Backlog and inboxadmin.Backlog.
package backlog

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// DB is what a backlog read goes through: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx. Reads only: a read-only role's handle is enough.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Age is one age field of a library's BacklogConfig, by name.
type Age struct {
	Field string
	Value time.Duration
}

// Validate refuses a negative age or a negative number of samples, naming
// lib and the field: a negative age would count rows from the future (none)
// and read as a clean backlog.
func Validate(lib string, samples int, ages ...Age) error {
	for _, a := range ages {
		if a.Value < 0 {
			return fmt.Errorf("%s: backlog: %s %v is negative", lib, a.Field, a.Value)
		}
	}
	if samples < 0 {
		return fmt.Errorf("%s: backlog: Samples %d is negative", lib, samples)
	}
	return nil
}

// State is what one read found; each library's BacklogState is this type,
// documented for its table.
type State struct {
	// Count is how many rows are in the status and old enough.
	Count int
	// Oldest is when the oldest of them began; zero when Count is 0.
	Oldest time.Time
	// Samples are the event ids of the oldest of them, oldest first, at
	// most the samples asked for.
	Samples []uuid.UUID
}

// Read runs count with args; it selects count(*) and the oldest row's time
// (NULL when there is none). When it found rows and samples > 0, Read runs
// sample with args and then samples; it selects the ids of the oldest rows,
// oldest first. fail names a failed statement's error with what Read was
// doing ("counting" or "sampling"), in the library's words.
func Read(ctx context.Context, db DB, count, sample string, args []any, samples int,
	fail func(doing string, err error) error) (State, error) {
	var (
		s      State
		oldest *time.Time
	)
	if err := db.QueryRow(ctx, count, args...).Scan(&s.Count, &oldest); err != nil {
		return s, fail("counting", err)
	}
	if s.Count == 0 {
		return s, nil
	}
	s.Oldest = *oldest
	if samples == 0 {
		return s, nil
	}
	rows, err := db.Query(ctx, sample, append(args[:len(args):len(args)], samples)...)
	if err != nil {
		return s, fail("sampling", err)
	}
	if s.Samples, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil {
		return s, fail("sampling", err)
	}
	return s, nil
}
