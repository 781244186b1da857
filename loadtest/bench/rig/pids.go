package rig

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times on Linux.
const clockTicks = 100

// ProcStat is what CPU accounting reads from /proc/<pid>/stat.
type ProcStat struct {
	PID, PPID int
	// Comm is the command name, without the parentheses.
	Comm string
	// CPU is the process's own user + system time (all its threads).
	CPU time.Duration
	// ChildrenCPU is the user + system time of its children that have exited
	// and been waited for (cutime + cstime): where a server's short-lived
	// workers' CPU goes once they are gone.
	ChildrenCPU time.Duration
}

// ReadProcStat reads /proc/<pid>/stat.
func ReadProcStat(pid int) (ProcStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcStat{}, err
	}
	return parseProcStat(b)
}

// parseProcStat parses a /proc/<pid>/stat line. The command name sits in
// parentheses and may hold spaces and parentheses itself, so the fields are
// counted from the last ')': state is the first after it, ppid the second,
// utime, stime, cutime and cstime the 12th to 15th.
func parseProcStat(b []byte) (ProcStat, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return ProcStat{}, fmt.Errorf("not a /proc/<pid>/stat line: %.80q", b)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:open])))
	if err != nil {
		return ProcStat{}, fmt.Errorf("/proc stat pid: %w", err)
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 15 {
		return ProcStat{}, fmt.Errorf("/proc/%d/stat has %d fields after the command, want at least 15", pid, len(f))
	}
	var n [5]int64
	for i, idx := range []int{1, 11, 12, 13, 14} {
		if n[i], err = strconv.ParseInt(f[idx], 10, 64); err != nil {
			return ProcStat{}, fmt.Errorf("/proc/%d/stat field %d: %w", pid, idx, err)
		}
	}
	tick := func(t int64) time.Duration { return time.Duration(t) * time.Second / clockTicks }
	return ProcStat{PID: pid, PPID: int(n[0]), Comm: string(b[open+1 : end]),
		CPU: tick(n[1] + n[2]), ChildrenCPU: tick(n[3] + n[4])}, nil
}

// AllProcStats reads every process's stat; processes that exit while it
// reads are skipped.
func AllProcStats() ([]ProcStat, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []ProcStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := ReadProcStat(pid); err == nil {
			out = append(out, s)
		}
	}
	return out, nil
}

// TreeCPU is the CPU time used so far by the process tree under root: root's
// own, its exited children's (as root waited for them), and each live
// child's own. A Postgres server is such a tree: the postmaster forks one
// backend per connection and its background workers, and reaps them.
// Comparing two readings gives a window's CPU, including backends that
// came or went within it. Grandchildren are not counted: Postgres has none.
func TreeCPU(stats []ProcStat, root int) (time.Duration, bool) {
	var total time.Duration
	found := false
	for _, s := range stats {
		switch {
		case s.PID == root:
			total += s.CPU + s.ChildrenCPU
			found = true
		case s.PPID == root:
			total += s.CPU
		}
	}
	return total, found
}

// PostmasterPID returns the pid of the Postgres server that pgURL reaches:
// the parent of the backend serving a fresh connection. It works without
// access to the server's data directory, and on a machine running several
// servers it finds the right one.
func PostmasterPID(ctx context.Context, pgURL string) (int, error) {
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return 0, fmt.Errorf("connecting to PostgreSQL to find its pid: %w", err)
	}
	defer conn.Close(ctx)
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, fmt.Errorf("asking PostgreSQL for its backend pid: %w", err)
	}
	s, err := ReadProcStat(backend)
	if err != nil {
		return 0, fmt.Errorf("backend %d is not a process of this machine (is PostgreSQL remote?): %w", backend, err)
	}
	return s.PPID, nil
}

// ListenerPID returns the pid of the process listening on TCP port port on
// this machine: the socket's inode from /proc/net/tcp{,6}, then the process
// holding it among /proc/*/fd (which needs root or the same user).
func ListenerPID(port int) (int, error) {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, ino := range listeningInodes(b, port) {
			inodes[ino] = true
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("nothing listens on port %d", port)
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		target, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(target, "socket:[") {
			continue
		}
		if inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] {
			pid, err := strconv.Atoi(strings.Split(fd, "/")[2])
			if err == nil {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("port %d's listener is not among the processes this user may inspect", port)
}

// listeningInodes returns the inodes of the sockets in LISTEN state on port
// in a /proc/net/tcp or tcp6 table.
func listeningInodes(table []byte, port int) []string {
	const listen = "0A"
	want := fmt.Sprintf(":%04X", port)
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(table))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		if len(f) < 10 || f[3] != listen || !strings.HasSuffix(f[1], want) {
			continue
		}
		out = append(out, f[9])
	}
	return out
}

// Servers are the pids of the shared servers a platform runs on, found
// once per run; 0 is a server not found (it is then left out of the CPU
// figures, with the reason in Missing).
type Servers struct {
	Postmaster, Kafka int
	Missing           []string
}

// FindServers finds the Postgres server pgURL reaches and the Kafka broker
// listening on the first of brokers' ports, when they run on this machine.
func FindServers(ctx context.Context, pgURL string, brokers []string) Servers {
	var s Servers
	var err error
	if s.Postmaster, err = PostmasterPID(ctx, pgURL); err != nil {
		s.Missing = append(s.Missing, "postgres: "+err.Error())
	}
	if len(brokers) == 0 {
		s.Missing = append(s.Missing, "kafka: no brokers")
		return s
	}
	_, p, perr := net.SplitHostPort(brokers[0])
	port, err := strconv.Atoi(p)
	if perr == nil {
		perr = err
	}
	if perr != nil {
		s.Missing = append(s.Missing, fmt.Sprintf("kafka: broker %q has no port", brokers[0]))
		return s
	}
	if s.Kafka, err = ListenerPID(port); err != nil {
		s.Missing = append(s.Missing, "kafka: "+err.Error())
	}
	return s
}

// CPUGroups returns the CPU time used so far by each process of the run:
// the four programs by name, "postgres" (the whole server, see TreeCPU),
// "kafka" (the broker's JVM) and extra, pids by name (k6). Groups that
// cannot be read are left out.
func (p *Platform) CPUGroups(srv Servers, extra map[string]int) map[string]time.Duration {
	out := p.CPUTimes()
	stats, err := AllProcStats()
	if err != nil {
		return out
	}
	if srv.Postmaster > 0 {
		if t, ok := TreeCPU(stats, srv.Postmaster); ok {
			out["postgres"] = t
		}
	}
	if srv.Kafka > 0 {
		// The JVM's threads are all in its own stat; it forks nothing.
		if t, ok := TreeCPU(stats, srv.Kafka); ok {
			out["kafka"] = t
		}
	}
	for name, pid := range extra {
		if t, ok := TreeCPU(stats, pid); ok {
			out[name] = t
		}
	}
	return out
}

// ChildPID returns the pid of a child of this process whose command name is
// comm (k6 while rig.K6 runs it), or 0.
func ChildPID(comm string) int {
	stats, err := AllProcStats()
	if err != nil {
		return 0
	}
	self := os.Getpid()
	for _, s := range stats {
		if s.PPID == self && s.Comm == comm {
			return s.PID
		}
	}
	return 0
}
