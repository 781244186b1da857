package prove

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PGReplication is how the harness's Postgres is replicated (issue 32):
// "" no standby; "async" a streaming standby, asynchronous; "sync" the
// same, synchronous (a commit returns once the standby flushed it).
// ONCEFLOW_PG_VERSION (15 or 17) in the environment picks the version, as
// for the dev stack.
type PGReplication string

// The replications.
const (
	PGNoStandby PGReplication = ""
	PGAsync     PGReplication = "async"
	PGSync      PGReplication = "sync"
)

// ParsePGReplication accepts "", async or sync.
func ParsePGReplication(s string) (PGReplication, error) {
	switch r := PGReplication(s); r {
	case PGNoStandby, PGAsync, PGSync:
		return r, nil
	}
	return "", fmt.Errorf("PG_REPLICATION must be async or sync (or empty: no standby), got %q", s)
}

// standbyProxy is the toxiproxy proxy in front of the standby.
const standbyProxy = "postgres-standby"

// haEnv is what stack.sh needs for the standby.
func (s *Stack) haEnv() []string {
	if s.HA == PGNoStandby || s.PGPort == 0 {
		return nil
	}
	sync := "0"
	if s.HA == PGSync {
		sync = "1"
	}
	return []string{"ONCEFLOW_PG_STANDBY=1", "ONCEFLOW_PG_SYNC=" + sync, fmt.Sprintf("ONCEFLOW_PG_STANDBY_PORT=%d", s.PGStandbyPort)}
}

// pgDataDir is the directory stack.sh keeps the Postgres nodes in.
func (s *Stack) pgDataDir() string {
	name := "pg"
	if os.Getenv("ONCEFLOW_PG_VERSION") == "17" {
		name = "pg17"
	}
	d := filepath.Join(s.dir, name)
	if r, err := filepath.EvalSymlinks(d); err == nil {
		d = r
	}
	return d
}

// primaryPort is the port of the node that is the primary now.
func (s *Stack) primaryPort() (primary, standby int) {
	b, _ := os.ReadFile(filepath.Join(s.pgDataDir(), "primary"))
	if strings.TrimSpace(string(b)) == "b" {
		return s.PGStandbyPort, s.PGPort
	}
	return s.PGPort, s.PGStandbyPort
}

// primaryConn connects to the primary directly.
func (s *Stack) primaryConn(ctx context.Context) (*pgx.Conn, int, error) {
	port, _ := s.primaryPort()
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	return c, port, err
}

// FailoverReport is what a failover did, for the history and the numbers.
type FailoverReport struct {
	// LaggedFor is how long the standby received nothing before the
	// primary died: what an asynchronous standby lacks, a synchronous one
	// made the clients wait for.
	LaggedFor time.Duration
	// LagBytes is how far the standby's received position was behind the
	// primary's at the crash (0 when it could not be read).
	LagBytes int64
	// KilledAt is when the primary died; PromotedAt when the standby took
	// writes.
	KilledAt, PromotedAt time.Time
	// Slots is what the promoted standby said of its logical slots.
	Slots string
	// SyncWait is how long the failover waited for the standby to hold a
	// synchronized copy of every failover slot (PostgreSQL 17), as a
	// failover manager waits before it calls a standby a candidate.
	SyncWait time.Duration
}

// slotSyncBound bounds waitSlotsSynced: the slot sync worker sleeps up to
// 30s between rounds when nothing changes.
const slotSyncBound = 35 * time.Second

// waitSlotsSynced waits, on PostgreSQL 17 and later, until the standby
// holds a synchronized copy of each of the primary's failover slots, at
// most slotSyncBound; it returns how long it waited.
func (s *Stack) waitSlotsSynced(ctx context.Context, primary *pgx.Conn) time.Duration {
	var num int
	if err := primary.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&num); err != nil || num < 170000 {
		return 0
	}
	_, standbyPort := s.primaryPort()
	standby, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", standbyPort))
	if err != nil {
		return 0
	}
	defer standby.Close(context.WithoutCancel(ctx))
	began := time.Now()
	_ = waitUntil(ctx, slotSyncBound, func() bool {
		var want []string
		rows, err := primary.Query(ctx, `SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'logical' AND failover`)
		if err != nil {
			return false
		}
		if want, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return false
		}
		var have int
		err = standby.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE synced AND slot_name = ANY($1)
			AND NOT temporary AND confirmed_flush_lsn IS NOT NULL`, want).Scan(&have)
		return err == nil && have == len(want)
	})
	return time.Since(began)
}

// Failover fails Postgres over as a machine loss does: the primary's
// walsender to the standby is frozen (SIGSTOP) for lag, so the standby
// receives nothing while clients go on committing (asynchronous: they are
// told committed; synchronous: they wait); then every process of the
// primary is killed (SIGKILL: no shutdown, no last WAL sent), and the
// standby is promoted (stack.sh failover). The old primary stays down
// until the next StartServers seeds it again as the new primary's standby.
func (s *Stack) Failover(ctx context.Context, lag time.Duration) (FailoverReport, error) {
	var rep FailoverReport
	if s.HA == PGNoStandby {
		return rep, fmt.Errorf("the stack has no standby (PG_REPLICATION=async or sync)")
	}
	conn, port, err := s.primaryConn(ctx)
	if err != nil {
		return rep, fmt.Errorf("connecting to the primary on %d: %w", port, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var sender, postmaster int
	if err := conn.QueryRow(ctx, `SELECT coalesce((SELECT pid FROM pg_stat_replication
		WHERE application_name = 'onceflow_standby' LIMIT 1), 0)`).Scan(&sender); err != nil {
		return rep, err
	}
	if b, err := os.ReadFile(filepath.Join(s.pgDataDir(), nodeDir(s, port), "postmaster.pid")); err == nil {
		postmaster, _ = strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	}
	if postmaster <= 0 {
		return rep, fmt.Errorf("no postmaster.pid for the primary on %d", port)
	}
	rep.SyncWait = s.waitSlotsSynced(ctx, conn)
	if sender > 0 && lag > 0 {
		if err := syscall.Kill(sender, syscall.SIGSTOP); err != nil {
			return rep, err
		}
		began := time.Now()
		hold(ctx, lag)
		rep.LaggedFor = time.Since(began)
		var lagBytes int64
		// The standby's position as the primary last heard it.
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := conn.QueryRow(cctx, `SELECT coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint FROM pg_stat_replication
			WHERE application_name = 'onceflow_standby' LIMIT 1), 0)`).Scan(&lagBytes); err == nil {
			rep.LagBytes = lagBytes
		}
		cancel()
	}
	// Every process of the primary, the frozen walsender too: SIGKILL
	// works on a stopped process.
	for _, pid := range append(childrenOf(postmaster), postmaster) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	rep.KilledAt = time.Now()
	_ = waitUntil(ctx, 10*time.Second, func() bool { return !alive(postmaster) })
	out, err := s.scriptOut(ctx, "failover")
	rep.PromotedAt = time.Now()
	if i := strings.Index(out, "logical slots it has: "); i >= 0 {
		rep.Slots = strings.TrimSpace(strings.SplitN(out[i+len("logical slots it has: "):], "\n", 2)[0])
	}
	return rep, err
}

// nodeDir is the data directory's name of the node on port.
func nodeDir(s *Stack, port int) string {
	if port == s.PGStandbyPort {
		return "standby"
	}
	return "data"
}

// childrenOf lists the pids whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces, so from the last ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 {
			if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
				out = append(out, child)
			}
		}
	}
	return out
}

// alive reports whether pid runs: not gone, and not a zombie waiting for
// its parent (the postmaster's is init, which may reap it late).
func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}
