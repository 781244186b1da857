// Package standby reads how far the primary's streaming standbys have
// flushed, and waits for them: what both libraries need to act only on
// commits a failover cannot take back (issue 32). The outbox's relays
// publish only what the standbys have (outbox Standby.PublishReplicated);
// the inbox's consumers commit their Kafka offsets only for what the
// standbys have (inbox Config.CommitReplicated), so that commits lost with
// an asynchronous primary are redelivered rather than skipped.
//
// The standbys are followed through their physical replication slots:
// pg_replication_slots.restart_lsn is the flush position a standby
// reported, readable by any role, so they must stream through slots (the
// dev stack's does; Patroni and CloudNativePG make them).
package standby

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// LSN is a position in the write-ahead log.
type LSN uint64

// ParseLSN reads PostgreSQL's text form of a pg_lsn, "16/B374D848".
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("standby: %q is not an LSN", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("standby: %q is not an LSN", s)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("standby: %q is not an LSN", s)
	}
	return LSN(h<<32 | l), nil
}

func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint64(l)>>32, uint32(l)) }

// ErrBehind is what a wait that ran out returns: the standbys (or one of
// them) have not flushed the position waited for, or there is none.
var ErrBehind = errors.New("the standbys have not flushed the commits in question")

// Querier is what the reads go through: a pool, a connection, a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// flushed reads the primary's flush position and the lowest flush position
// among the standbys' slots (NULL when there is none, or a slot was never
// used), and how many slots that is. pg_current_wal_flush_lsn() bounds
// every commit a query on the primary has seen: a commit made with
// synchronous_commit on is flushed before it is visible.
const flushed = `
SELECT pg_current_wal_flush_lsn()::text,
       (SELECT CASE WHEN count(*) = 0 OR bool_or(restart_lsn IS NULL) THEN NULL
                    ELSE min(restart_lsn)::text END
          FROM pg_replication_slots
         WHERE slot_type = 'physical' AND (cardinality($1::text[]) = 0 OR slot_name = ANY ($1::text[]))),
       (SELECT count(*) FROM pg_replication_slots
         WHERE slot_type = 'physical' AND (cardinality($1::text[]) = 0 OR slot_name = ANY ($1::text[]))),
       coalesce(host(inet_server_addr()), 'local') || ':' || coalesce(inet_server_port()::text, '') ||
         ' started ' || extract(epoch FROM pg_postmaster_start_time())::text`

// ErrSwitched is what a wait returns when a reading came from another
// server than the first (a failover while it waited): positions of two
// servers do not compare.
var ErrSwitched = errors.New("the database is another server now")

// Position is one reading.
type Position struct {
	// Server names the server the reading came from: its address and port
	// (which tell servers apart behind a multi-host URL) and its
	// postmaster's start time (which tells them apart behind one address;
	// a restart changes it too). A standby shares the old primary's
	// system identifier, and the timeline changes only at the first
	// checkpoint after a promotion, so neither can serve.
	Server string
	// Primary is the primary's flush position when it was read.
	Primary LSN
	// Standby is the lowest flush position among the standbys' slots; 0
	// when there is no slot or one was never used.
	Standby LSN
	// Slots is how many physical slots Standby is the lowest of.
	Slots int
}

// Has reports whether the standbys flushed target.
func (p Position) Has(target LSN) bool { return p.Slots > 0 && p.Standby >= target }

// Read reads the positions; slots names the standbys' physical slots that
// count (nil or empty: every physical slot).
func Read(ctx context.Context, q Querier, slots []string) (Position, error) {
	if slots == nil {
		slots = []string{}
	}
	var (
		primary string
		standby *string
		p       Position
	)
	if err := q.QueryRow(ctx, flushed, slots).Scan(&primary, &standby, &p.Slots, &p.Server); err != nil {
		return Position{}, fmt.Errorf("reading the standbys' flush position: %w", err)
	}
	var err error
	if p.Primary, err = ParseLSN(primary); err != nil {
		return Position{}, err
	}
	if standby != nil {
		if p.Standby, err = ParseLSN(*standby); err != nil {
			return Position{}, err
		}
	}
	return p, nil
}

// Await waits until the standbys flushed everything the primary had
// flushed when it was called, at most wait. It returns its first reading
// (whose Server says where that was); past wait, an error wrapping
// ErrBehind that says where they are; a reading from another server,
// ErrSwitched.
func Await(ctx context.Context, q Querier, slots []string, wait time.Duration) (Position, error) {
	deadline := time.Now().Add(wait)
	p, err := Read(ctx, q, slots)
	if err != nil || p.Has(p.Primary) {
		return p, err
	}
	_, err = Until(ctx, q, slots, p.Primary, p.Server, deadline)
	return p, err
}

// Until polls the standbys' position, with a growing pause (0.5 ms to
// 50 ms), until they flushed target or deadline passes: then an error
// wrapping ErrBehind that says where they are. target is a position on
// server (Position.Server); a reading from another one ends the wait with
// ErrSwitched. It returns the last position read.
func Until(ctx context.Context, q Querier, slots []string, target LSN, server string, deadline time.Time) (Position, error) {
	var p Position
	for pause := 500 * time.Microsecond; ; pause = min(2*pause, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			at := "no position"
			if p.Slots > 0 && p.Standby > 0 {
				at = p.Standby.String()
			}
			return p, fmt.Errorf("%w: want %s, the standbys' slots (%d) are at %s", ErrBehind, target, p.Slots, at)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return p, ctx.Err()
		case <-t.C:
		}
		var err error
		if p, err = Read(ctx, q, slots); err != nil {
			return p, err
		}
		if p.Server != server {
			return p, fmt.Errorf("%w (%s, was %s)", ErrSwitched, p.Server, server)
		}
		if p.Has(target) {
			return p, nil
		}
	}
}
