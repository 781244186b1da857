package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Machine is what the numbers mean little without.
type Machine struct {
	Date     string  `json:"date"`
	CPUs     int     `json:"cpus"`
	CPUModel string  `json:"cpuModel"`
	MemoryGB float64 `json:"memoryGiB"`
	Load     string  `json:"load"`
	Go       string  `json:"go"`
	Postgres string  `json:"postgres"`
	Kafka    string  `json:"kafka"`
	// FsyncPerSec is pg_test_fsync's fdatasync rate for one 8 kB write: the
	// ceiling on commits per second that each wait for their own flush.
	FsyncPerSec float64 `json:"fsyncPerSec,omitempty"`
}

func machineFacts(ctx context.Context, root, pgURL string, fsync bool) Machine {
	m := Machine{Date: time.Now().UTC().Format("2006-01-02 15:04:05 UTC"), CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if s := regexp.MustCompile(`(?m)^model name\s*:\s*(.+)$`).FindSubmatch(b); s != nil {
			m.CPUModel = string(s[1])
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if s := regexp.MustCompile(`(?m)^MemTotal:\s*(\d+) kB`).FindSubmatch(b); s != nil {
			kb, _ := strconv.ParseFloat(string(s[1]), 64)
			m.MemoryGB = kb / (1 << 20)
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.Load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	if conn, err := pgx.Connect(ctx, pgURL); err == nil {
		_ = conn.QueryRow(ctx, `SELECT version()`).Scan(&m.Postgres)
		conn.Close(ctx)
	}
	if jars, _ := filepath.Glob(filepath.Join(root, ".devstack", "kafka", "libs", "kafka_2.13-*.jar")); len(jars) > 0 {
		m.Kafka = strings.TrimSuffix(strings.TrimPrefix(filepath.Base(jars[0]), "kafka_2.13-"), ".jar")
	}
	if fsync {
		m.FsyncPerSec = fsyncRate(ctx, root)
	}
	return m
}

// fsyncRate runs pg_test_fsync for 1 s per method on the dev stack's disk
// and returns the fdatasync rate (Postgres's wal_sync_method here).
func fsyncRate(ctx context.Context, root string) float64 {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_test_fsync")
	if len(bins) == 0 {
		return 0
	}
	sort.Strings(bins)
	dir := filepath.Join(root, ".devstack")
	if _, err := os.Stat(dir); err != nil {
		dir = os.TempDir()
	}
	f := filepath.Join(dir, fmt.Sprintf("pg_test_fsync.%d.tmp", os.Getpid()))
	defer os.Remove(f)
	out, err := exec.CommandContext(ctx, bins[len(bins)-1], "-s", "1", "-f", f).Output()
	if err != nil {
		return 0
	}
	// The first section writes one 8 kB block per sync; take its fdatasync line.
	if s := regexp.MustCompile(`(?m)^\s*fdatasync\s+([\d.,]+) ops/sec`).FindSubmatch(out); s != nil {
		v, _ := strconv.ParseFloat(strings.ReplaceAll(string(s[1]), ",", ""), 64)
		return v
	}
	return 0
}

func printMachine(w io.Writer, m Machine) {
	fmt.Fprintf(w, "  date:     %s\n  cpus:     %d (%s)\n  memory:   %.1f GiB\n  load:     %s (1/5/15 min)\n  go:       %s\n  postgres: %s\n  kafka:    %s\n  fsync:    %.0f fdatasync/s (pg_test_fsync, 8 kB)\n",
		m.Date, m.CPUs, m.CPUModel, m.MemoryGB, m.Load, m.Go, m.Postgres, m.Kafka, m.FsyncPerSec)
}

// quietLoadPerCPU is the most load per CPU, over each of the 1, 5 and 15
// minutes before a run, at which the machine counts as quiet: a quarter of
// the cores busy on average. The 15-minute figure matters too: a load that
// just fell (another run ended) still leaves caches, page cache and the
// disk's queue in the state that run left them.
const quietLoadPerCPU = 0.25

// quietness tells whether the load averages at a run's start ("1 5 15",
// /proc/loadavg's first fields) allow calling the machine quiet, and why.
// An unknown load is not quiet: a report calls a run quiet only on evidence.
func quietness(load string, cpus int) (bool, string) {
	f := strings.Fields(load)
	if len(f) < 3 || cpus < 1 {
		return false, fmt.Sprintf("load at start unknown (%q)", load)
	}
	limit := quietLoadPerCPU * float64(cpus)
	for i, window := range []string{"1-minute", "5-minute", "15-minute"} {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return false, fmt.Sprintf("load at start unreadable (%q)", load)
		}
		if v > limit {
			return false, fmt.Sprintf("%s load %s at start, above %.2f (%.2f per CPU × %d CPUs)", window, f[i], limit, quietLoadPerCPU, cpus)
		}
	}
	return true, fmt.Sprintf("load %s (1/5/15 min) at start, each at most %.2f (%.2f per CPU × %d CPUs)", strings.Join(f[:3], " / "), limit, quietLoadPerCPU, cpus)
}

// treeRevision is the working tree's commit as `git describe --always
// --dirty` names it ("" outside a git checkout): a figure means little
// without the code it measured.
func treeRevision(ctx context.Context, root string) string {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "describe", "--always", "--dirty", "--abbrev=12").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
