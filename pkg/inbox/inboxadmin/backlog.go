package inboxadmin

import (
	"context"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/backlog"
)

// Backlog is the inbox's read of "rows in status S older than T", for
// operators' checks (tools/reconcile) and dashboards, so that nothing outside
// this package has to know the table's name or its statuses. It only
// SELECTs: a read-only role (pgroles' readers, e.g. reconcile_ro) may run it.

// BacklogDB is what Backlog reads through: a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx (Query and QueryRow). Reads only: a read-only role's handle is
// enough.
type BacklogDB = backlog.DB

// BacklogConfig says which rows Backlog counts. The zero value counts every
// consumer's expired leases, uncertain and dead-lettered rows, of any age,
// and lists no samples.
type BacklogConfig struct {
	// Consumer restricts the counts to one consumer (inbox.Config.Name); ""
	// counts every consumer in the database.
	Consumer string
	// LeaseExpiredFor counts a leased row once its lease_until is at least
	// this far in the past: its worker died mid-effect and nobody took the
	// message over.
	LeaseExpiredFor time.Duration
	// UncertainOlderThan counts an uncertain row (an effect that may or may
	// not have happened) once its received_at is at least this old. 0
	// counts all: each needs an operator.
	UncertainOlderThan time.Duration
	// DeadLetteredOlderThan counts a dead-lettered row once its received_at
	// is at least this old: a dead letter nobody requeued within an SLA.
	DeadLetteredOlderThan time.Duration
	// ParkedOlderThan counts a parked message (one held behind a dead
	// message of its aggregate) once its parked_at is at least this old.
	ParkedOlderThan time.Duration
	// Samples is how many message ids of the oldest counted rows each
	// status lists, oldest first. 0 lists none.
	Samples int
}

// Validate refuses negative fields: a negative age would count rows from
// the future (none) and read as a clean inbox.
func (c BacklogConfig) Validate() error {
	return backlog.Validate("inbox", c.Samples,
		backlog.Age{Field: "LeaseExpiredFor", Value: c.LeaseExpiredFor},
		backlog.Age{Field: "UncertainOlderThan", Value: c.UncertainOlderThan},
		backlog.Age{Field: "DeadLetteredOlderThan", Value: c.DeadLetteredOlderThan},
		backlog.Age{Field: "ParkedOlderThan", Value: c.ParkedOlderThan})
}

// BacklogState is what Backlog found in one status: Count rows old enough,
// Oldest when the oldest of them began (its lease_until for an expired
// lease, its received_at otherwise; zero when Count is 0), and Samples, the
// message (event) ids of the oldest of them, oldest first, at most
// BacklogConfig.Samples.
type BacklogState = backlog.State

// BacklogReport is Backlog's result, one BacklogState per status that needs
// attention.
type BacklogReport struct {
	LeaseExpired BacklogState
	Uncertain    BacklogState
	DeadLettered BacklogState
	// Parked: messages held behind a dead message of their aggregate
	// (inbox_parked_messages), oldest parked first; they go once the dead
	// one is requeued and applied.
	Parked BacklogState
}

// The backlog's statements, one pair per status: $1 is the age in
// microseconds (now() is the database's clock, which stamped received_at
// and lease_until, so application hosts' skew does not matter), $2 the
// consumer or "", $3 the number of samples.
const (
	backlogAge      = " <= now() - $1::bigint * interval '1 microsecond' AND ($2 = '' OR consumer = $2)"
	whereLeaseOver  = "status = 'leased' AND lease_until" + backlogAge
	whereUncertain  = "status = 'uncertain' AND received_at" + backlogAge
	whereDeadLetter = "status = 'dead_lettered' AND received_at" + backlogAge

	sqlLeaseOverCount    = "SELECT count(*), min(lease_until) FROM inbox_messages WHERE " + whereLeaseOver
	sqlLeaseOverSamples  = "SELECT message_id FROM inbox_messages WHERE " + whereLeaseOver + " ORDER BY lease_until, message_id LIMIT $3"
	sqlUncertainCount    = "SELECT count(*), min(received_at) FROM inbox_messages WHERE " + whereUncertain
	sqlUncertainSamples  = "SELECT message_id FROM inbox_messages WHERE " + whereUncertain + " ORDER BY received_at, message_id LIMIT $3"
	sqlDeadLetterCount   = "SELECT count(*), min(received_at) FROM inbox_messages WHERE " + whereDeadLetter
	sqlDeadLetterSamples = "SELECT message_id FROM inbox_messages WHERE " + whereDeadLetter + " ORDER BY received_at, message_id LIMIT $3"

	whereParked      = "parked_at" + backlogAge
	sqlParkedCount   = "SELECT count(*), min(parked_at) FROM inbox_parked_messages WHERE " + whereParked
	sqlParkedSamples = "SELECT message_id FROM inbox_parked_messages WHERE " + whereParked + " ORDER BY parked_at, seq LIMIT $3"
)

// Backlog counts the inbox's expired leases, uncertain rows, dead letters
// and parked messages older than cfg says, with the oldest one's time and the ids of
// the oldest few. Its errors are named like the consumer's (a database that
// cannot be reached satisfies pgerr.IsUnavailable); a missing table (an
// unmigrated database) stays a *pgconn.PgError in the chain (SQLSTATE
// 42P01), never an empty report.
func Backlog(ctx context.Context, db BacklogDB, cfg BacklogConfig) (BacklogReport, error) {
	if err := cfg.Validate(); err != nil {
		return BacklogReport{}, err
	}
	var (
		rep BacklogReport
		err error
	)
	for _, s := range []struct {
		into          *BacklogState
		what          string
		count, sample string
		olderThan     time.Duration
	}{
		{&rep.LeaseExpired, "expired leases", sqlLeaseOverCount, sqlLeaseOverSamples, cfg.LeaseExpiredFor},
		{&rep.Uncertain, "uncertain rows", sqlUncertainCount, sqlUncertainSamples, cfg.UncertainOlderThan},
		{&rep.DeadLettered, "dead-lettered rows", sqlDeadLetterCount, sqlDeadLetterSamples, cfg.DeadLetteredOlderThan},
		{&rep.Parked, "parked messages", sqlParkedCount, sqlParkedSamples, cfg.ParkedOlderThan},
	} {
		if *s.into, err = backlogState(ctx, db, s.what, s.count, s.sample, s.olderThan, cfg); err != nil {
			return BacklogReport{}, err
		}
	}
	return rep, nil
}

func backlogState(ctx context.Context, db BacklogDB, what, count, sample string, olderThan time.Duration, cfg BacklogConfig) (BacklogState, error) {
	return backlog.Read(ctx, db, count, sample, []any{olderThan.Microseconds(), cfg.Consumer}, cfg.Samples,
		func(doing string, err error) error { return dbErrors.Translate("inbox: "+doing+" "+what, err) })
}
