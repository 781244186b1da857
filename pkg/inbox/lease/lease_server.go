package lease

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// After a failover, check before the first call of anything that may have
// been called.
//
// With asynchronous replication a promoted standby lacks the old primary's
// last commits, among them lease-mode rows that recorded a call (the lease,
// or its done mark): the call landed at the other side, the row did not
// survive. The message is redelivered (its offset is committed only after
// the row) and finds no row, which is every sign of a first delivery: it
// would be called again without a check. A third party that cannot dedupe
// books it twice.
//
// The consumer cannot see which rows were lost, but it can see that its
// database is another server: each lease transaction compares the server it
// runs on with the one the consumer recorded (inbox_servers, written long
// before and replicated with everything else). On a difference it records
// the switch (tServerSwitch), and from then on a message with no row whose
// Kafka timestamp is older than the switch (plus serverSwitchClockMargin) is
// leased as may_have_called: its first call is preceded by Effect.Check, as
// after a takeover. A message sent later cannot have been called on the old
// server, and is called at once. docs/inbox.md ("After a failover") says
// what this does not cover.

// serverSwitchClockMargin is added to the moment a switch is seen: a Kafka
// timestamp is the producer's clock (or the broker's), not the database's;
// producers whose clocks run ahead of the database's by up to this much
// still have their messages from before the switch checked. A message sent
// within the margin after the switch is checked needlessly, which costs a
// Check, never a call.
const serverSwitchClockMargin = time.Minute

// serverIdentity reads the server a statement runs on, and the one the
// consumer recorded ($1). The address and port tell servers apart behind a
// multi-host URL; the postmaster's start time tells them apart behind one
// address (a virtual IP, a DNS name, a proxy) and changes on a restart too
// (a needless switch: a restart loses no commit, and the switch costs
// checks, not calls). The start time is read as epoch seconds, which no
// session's TimeZone changes. None of these needs a privilege. Not used: a
// standby shares the old primary's system identifier (pg_control_system),
// and pg_control_checkpoint's timeline changes only with the first
// checkpoint after a promotion, which may come minutes after the first
// lease there.
const serverIdentity = `
SELECT cur.server, s.server IS NOT DISTINCT FROM cur.server
FROM (SELECT coalesce(host(inet_server_addr()), 'local') || ':' || coalesce(inet_server_port()::text, '') ||
             ' started ' || extract(epoch FROM pg_postmaster_start_time())::text AS server) cur
LEFT JOIN inbox_servers s ON s.consumer = $1`

// watchServer compares, in the lease transaction tx, the server it runs on
// with the consumer's recorded one, and records a new or switched server;
// the lease statements then read the switch's check_before in tx. It takes
// the row's lock only when the two differ, so the consumer's lease
// transactions do not queue behind one another.
func (a *applier) watchServer(ctx context.Context, tx pgx.Tx) error {
	var server string
	var same bool
	if err := tx.QueryRow(ctx, serverIdentity, a.Config.Name).Scan(&server, &same); err != nil {
		return engine.DBErrors.Translate("reading the database server", err)
	}
	if same {
		return nil
	}
	var switched bool
	err := tx.QueryRow(ctx, state.ServerSwitch.SQL, a.Config.Name, server, serverSwitchClockMargin.Microseconds()).Scan(&switched)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // another transaction recorded it first
		return nil
	case err != nil:
		return engine.DBErrors.Translate("recording the database server", err)
	case switched:
		engine.ServerSwitches(a.Config.Metrics).WithLabelValues(a.Config.Name).Inc()
		a.Config.Logger.WarnContext(ctx, "inbox database server switched (a failover?): messages sent before now that have no row "+
			"are checked with the other side before their first call, in case their row was lost with the old server",
			slog.String("consumer", a.Config.Name), slog.String("server", server))
	}
	return nil
}
