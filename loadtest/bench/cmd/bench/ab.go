package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/onceflow/onceflow/loadtest/bench/rig"
)

// Run is one k6 run and what was measured around it.
type Run struct {
	// Key is the scenario (outbox, naive, ramp, spike, soak); Side is ""
	// for the working tree's programs and "base" for the -base revision's;
	// Round counts from 0 with -ab-rounds.
	Key   string     `json:"key"`
	Side  string     `json:"side,omitempty"`
	Round int        `json:"round"`
	K6    rig.Report `json:"k6"`
	// Windows are the ramp's step plateaus, or a steady run's whole load.
	Windows []Window `json:"windows,omitempty"`
	// CPUPerOrderUs is every process group's CPU over the whole k6 run
	// (load, drain, audit) per order placed; k6's is its rusage.
	CPUPerOrderUs map[string]float64 `json:"cpuPerOrderUs,omitempty"`
	// Profiles are the CPU profiles and traces saved (-profile-dir).
	Profiles []string `json:"profiles,omitempty"`
	// StatementsPerOrder is each program's SQL statements over the whole
	// run per order placed, "all" their sum (statements.go); TopStatements
	// the statements that ran at least once per ten orders.
	StatementsPerOrder map[string]float64 `json:"statementsPerOrder,omitempty"`
	TopStatements      []stmtStat         `json:"topStatements,omitempty"`
}

// buildBase builds rev's programs into bin/bench/base-<commit>: it exports
// the revision's tree with git archive into a temporary directory (no
// worktree to clean up, whatever the working tree's state) and runs the
// rig's Build there. It returns the side and the full commit.
func buildBase(ctx context.Context, root, rev string, say func(string, ...any)) (side, string, error) {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--verify", rev+"^{commit}").Output()
	if err != nil {
		return side{}, "", fmt.Errorf("-base %s: not a commit of this repository: %w", rev, err)
	}
	commit := strings.TrimSpace(string(out))
	binDir := filepath.Join(root, "bin", "bench", "base-"+commit[:12])
	src, err := os.MkdirTemp("", "onceflow-base-")
	if err != nil {
		return side{}, "", err
	}
	defer os.RemoveAll(src)
	say("building %s's programs (git archive %s) into %s …", rev, commit[:12], binDir)
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return side{}, "", err
	}
	var stderr bytes.Buffer
	archive.Stderr, untar.Stderr = &stderr, &stderr
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		return side{}, "", err
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return side{}, "", fmt.Errorf("git archive %s: %w: %s", commit, err, stderr.String())
	}
	if err := untar.Wait(); err != nil {
		return side{}, "", fmt.Errorf("unpacking %s: %w: %s", commit, err, stderr.String())
	}
	if err := rig.Build(ctx, src, binDir); err != nil {
		return side{}, "", fmt.Errorf("building -base %s: %w", rev, err)
	}
	return side{name: "base", binDir: binDir}, commit, nil
}

// measureRun fills run's windows and whole-run CPU from the databases and
// the samples taken during it.
func measureRun(ctx context.Context, p *rig.Platform, run *Run, shape loadShape, samples []sample) error {
	if run.K6.OrdersPlaced > 0 && len(samples) > 1 {
		first, last := samples[0], samples[len(samples)-1]
		run.CPUPerOrderUs = cpuPerOrder(samples, first.at, last.at, int(run.K6.OrdersPlaced))
		if k6, ok := run.K6.CPUSeconds["k6"]; ok {
			run.CPUPerOrderUs["k6"] = k6 / run.K6.OrdersPlaced * 1e6
		}
	}
	if shape.rate == 0 && len(shape.steps) == 0 {
		return nil
	}
	orders, err := loadOrders(ctx, p)
	if err != nil {
		return err
	}
	if len(orders) == 0 {
		return fmt.Errorf("no orders in the database")
	}
	t0 := orders[0].placed
	if shape.rate > 0 {
		run.Windows = []Window{window(shape.rate, t0, t0.Add(shape.for_), orders, samples)}
		return nil
	}
	for i, w := range rampWindows(shape.steps, shape.hold, t0) {
		run.Windows = append(run.Windows, window(shape.steps[i], w[0], w[1], orders, samples))
	}
	return nil
}

// profileDuring starts CPU profiles of the four programs over the middle
// half of a steady run's load, and execution traces of its first seconds (-profile-dir; none for the ramp and the
// spike, whose load changes under the profile) and returns a function that
// waits for them and lists the files written.
func profileDuring(ctx context.Context, o options, p *rig.Platform, label string, shape loadShape, say func(string, ...any)) func() []string {
	if o.profileDir == "" || shape.rate == 0 || shape.for_ < 4*time.Second {
		return func() []string { return nil }
	}
	dir := at(o.root, o.profileDir)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var files []string
	// k6 takes a moment to start; a quarter of the load is plenty of margin.
	delay, length := shape.for_/4, shape.for_/2
	for _, prog := range programGroups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return
			}
			// An execution trace of the first seconds beside the profile:
			// where each goroutine waited (the knee is set by waits).
			traced := make(chan string, 1)
			go func() {
				path := filepath.Join(dir, label+"-"+prog+".trace")
				if err := p.Trace(ctx, prog, min(length, 4*time.Second), path); err != nil {
					say("%s: %v", label, err)
					path = ""
				}
				traced <- path
			}()
			path := filepath.Join(dir, label+"-"+prog+".pprof")
			if err := p.Profile(ctx, prog, length, path); err != nil {
				say("%s: %v", label, err)
				path = ""
			}
			mu.Lock()
			defer mu.Unlock()
			for _, f := range []string{path, <-traced} {
				if f != "" {
					files = append(files, f)
				}
			}
		}()
	}
	return func() []string {
		wg.Wait()
		return files
	}
}
