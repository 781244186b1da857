package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/loadtest/bench/rig"
)

type options struct {
	root, out, jsonOut, svgOut string
	// history is where each written section is kept too (history.go).
	history string
	// from is a results JSON of an earlier run to write the page from,
	// running nothing (-from).
	from           string
	only           map[string]bool
	rate           int
	steadyDuration string
	steps          string
	stepDuration   string
	spikeRate      int
	soakDuration   string
	fsync          bool
	knobRate       int
	drainEvents    int
	// base is a git revision whose programs run the k6 scenarios beside the
	// working tree's (-base, make bench BASE=), abRounds times each.
	base       string
	abRounds   int
	profileDir string
	peers      peerOptions
	// commitDelayUs slows every k6 run's commits (-commit-delay-us).
	commitDelayUs int
}

var parts = []string{"write", "drain", "consume", "cdc", "modes", "ramp", "spike", "soak", "knobs", "peers"}

// defaultParts are what `make bench` runs; knobs (platform settings varied
// one at a time, ~4 min) and peers (Debezium against the platform's
// log-based relay, peers.go; needs java) are asked for by name.
var defaultParts = parts[:8]

func parseFlags(args []string, stdout io.Writer) (options, error) {
	var o options
	var only string
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.StringVar(&o.root, "root", ".", "the repository's root")
	fs.StringVar(&o.out, "out", "BENCHMARKS.md", "the file whose results section is rewritten (empty: none)")
	fs.StringVar(&o.jsonOut, "json", "benchmarks/results.json", "where the results go as JSON (empty: nowhere)")
	fs.StringVar(&o.svgOut, "svg", "benchmarks/steady-lag.svg", "where the steady run's lag plot goes (empty: nowhere)")
	fs.StringVar(&o.history, "history", "benchmarks/history", "where every section written to -out is also kept, one file per run and part (empty: nowhere)")
	fs.StringVar(&o.from, "from", "", "write -out's sections and the history from this results JSON of an earlier run (e.g. benchmarks/results.json), running nothing")
	fs.StringVar(&only, "only", strings.Join(defaultParts, ","), "which parts to run: "+strings.Join(parts, ","))
	fs.IntVar(&o.knobRate, "knob-rate", 300, "orders/s offered to every variant of the knobs part")
	fs.IntVar(&o.rate, "rate", 1000, "orders/s offered to naive and outbox mode alike (the steady runs)")
	fs.StringVar(&o.steadyDuration, "steady-duration", "20s", "how long each steady run offers load")
	fs.StringVar(&o.steps, "steps", "100,200,300,400,600,800,1000,1500,2000", "the ramp's steps, orders/s")
	fs.StringVar(&o.stepDuration, "step-duration", "10s", "how long the ramp holds each step")
	fs.IntVar(&o.spikeRate, "spike-rate", 1000, "the spike's orders/s (over a baseline of 100)")
	fs.StringVar(&o.soakDuration, "soak-duration", "60s", "the soak's length in this run (loadtest/k6/soak.js defaults to 30m)")
	fs.IntVar(&o.drainEvents, "drain-events", 100_000, "the backlog the drain and cdc parts' relays drain (issue 15: 100,000)")
	fs.BoolVar(&o.fsync, "fsync", true, "measure the disk's fsync rate with pg_test_fsync (~10 s)")
	fs.StringVar(&o.base, "base", "", "a git revision (commit, tag, branch) whose programs run every k6 scenario too, alternated with the working tree's, each figure then with the base's value and the ratio (make bench BASE=rev)")
	fs.IntVar(&o.abRounds, "ab-rounds", 1, "with -base: rounds of each scenario per side, alternated A B, B A, … (figures are the rounds' mean)")
	fs.IntVar(&o.commitDelayUs, "commit-delay-us", 0, "emulate a slower disk in the k6 runs: their databases set commit_delay to this many µs with commit_siblings 0, so every WAL flush waits that much first; the sleep's granularity makes any value at least ~90 µs here (10: serial commits 6,000 → 3,900/s, a disk of about 5,000 fdatasync/s; 0: off)")
	fs.StringVar(&o.profileDir, "profile-dir", "", "save a CPU profile (the middle half) and an execution trace (4 s of it) of every program over the steady and soak runs here (empty: none); read with go tool pprof -top FILE, go tool trace -pprof=sync FILE")
	fs.IntVar(&o.peers.rounds, "peers-rounds", 2, "peers: rounds, each running every relay once (the first relay changes from round to round)")
	peerRates := fs.String("peers-rates", "200,1000,5000", "peers: the paced phases' rates, events/s from 8 connections (the headline judges 200, 1,000 and 5,000)")
	fs.DurationVar(&o.peers.paced, "peers-paced", 20*time.Second, "peers: how long each paced phase commits events")
	fs.DurationVar(&o.peers.idle, "peers-idle", 10*time.Second, "peers: the idle window whose CPU each relay is charged")
	fs.IntVar(&o.peers.big, "peers-big", 0, "peers: after the rounds, each relay as a fresh process drains one transaction of this many events, for its drain rate and peak RSS (issue 23: 1000000; 0: not run)")
	if err := fs.Parse(args[1:]); err != nil {
		return o, err
	}
	for _, r := range strings.Split(*peerRates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n < 1 {
			return o, fmt.Errorf("-peers-rates: %q is not a positive rate", r)
		}
		o.peers.rates = append(o.peers.rates, n)
	}
	if o.peers.rounds < 1 || o.peers.paced <= 0 || o.peers.idle <= 0 {
		return o, fmt.Errorf("-peers-rounds, -peers-paced and -peers-idle must be positive")
	}
	if o.peers.big < 0 {
		return o, fmt.Errorf("-peers-big: %d, want 0 (not run) or more", o.peers.big)
	}
	if o.drainEvents < 1 {
		return o, fmt.Errorf("-drain-events: %d, want at least 1", o.drainEvents)
	}
	if o.abRounds < 1 {
		return o, fmt.Errorf("-ab-rounds: %d, want at least 1", o.abRounds)
	}
	o.only = map[string]bool{}
	for _, p := range strings.Split(only, ",") {
		if p = strings.TrimSpace(p); p != "" {
			if !contains(parts, p) {
				return o, fmt.Errorf("-only: unknown part %q (have %s)", p, strings.Join(parts, ","))
			}
			o.only[p] = true
		}
	}
	return o, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Results is everything one `make bench` measured; it is also the JSON file.
type Results struct {
	Machine Machine `json:"machine"`
	// Revision is the working tree's commit (and whether it had
	// uncommitted changes), as `git describe --always --dirty` says.
	Revision string `json:"revision,omitempty"`
	// Parts are the parts this invocation ran (-only).
	Parts   []string              `json:"parts,omitempty"`
	Started time.Time             `json:"started"`
	Seconds float64               `json:"seconds"`
	Go      map[string]GoBench    `json:"goBenchmarks,omitempty"`
	K6      map[string]rig.Report `json:"k6,omitempty"`
	Lag     []LagPoint            `json:"steadyLagSeries,omitempty"`
	Knobs   []Knob                `json:"knobs,omitempty"`
	// Peers are the peers part's runs, every relay in every round.
	Peers []PeerRun `json:"peers,omitempty"`
	// PeersBig are the peers part's drains of one -peers-big transaction.
	PeersBig []PeerBig `json:"peersBig,omitempty"`
	// Base is the -base revision the k6 scenarios also ran against.
	Base string `json:"base,omitempty"`
	// CommitDelayUs is -commit-delay-us: every k6 run's databases waited
	// this long before each WAL flush (a slower disk, emulated).
	CommitDelayUs int `json:"commitDelayUs,omitempty"`
	// Runs are every k6 run with the figures measured around it (both
	// sides with -base), in the order they ran.
	Runs     []Run    `json:"runs,omitempty"`
	Problems []string `json:"problems,omitempty"`
	// Missed lists scenario thresholds on lag or backlog that failed: goals
	// missed, not broken invariants.
	Missed []string `json:"missed,omitempty"`
}

// GoBench is one `go test -bench` result: its reported metrics by unit.
type GoBench struct {
	Name    string             `json:"name"`
	Metrics map[string]float64 `json:"metrics"`
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	o, err := parseFlags(args, stdout)
	if err != nil {
		return err
	}
	root, err := filepath.Abs(o.root)
	if err != nil {
		return err
	}
	o.root = root
	start := time.Now()
	res := Results{Started: start.UTC(), Go: map[string]GoBench{}, K6: map[string]rig.Report{}}
	say := func(format string, a ...any) {
		fmt.Fprintf(stdout, "[%5.0fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}

	if o.from != "" {
		return rewrite(o, stdout, say)
	}
	say("machine facts …")
	res.Machine = machineFacts(ctx, root, adminURL(getenv), o.fsync)
	res.Revision = treeRevision(ctx, root)
	for _, p := range parts {
		if o.only[p] {
			res.Parts = append(res.Parts, p)
		}
	}
	printMachine(stdout, res.Machine)

	goBench := func(part, pkg, pattern, name string) {
		if !o.only[part] {
			return
		}
		say("go test -bench %s %s …", pattern, pkg)
		b, err := runGoBench(ctx, root, pkg, pattern, name, o.drainEvents, stdout)
		if err != nil {
			res.Problems = append(res.Problems, fmt.Sprintf("%s: %v", part, err))
			say("%s failed: %v", part, err)
			return
		}
		res.Go[part] = b
	}
	// Library benchmarks first: they need the machine to themselves most.
	// A variant named "workers=8/synchronous_commit=off" is, to -bench, a
	// child of "workers=8", so those run too; the result is the default's.
	goBench("write", "./pkg/outbox/", "EnqueueOverhead$/^workers=8$", "BenchmarkEnqueueOverhead/workers=8")
	goBench("drain", "./pkg/outbox/", "RelayDrain$/^batch=1000$", "BenchmarkRelayDrain/batch=1000")
	goBench("consume", "./services/billing/", "Consume$", "BenchmarkConsume")
	// The log-based relay beside the polling one, every figure from this
	// run: each benchmark runs its poll, table and wal modes one after the
	// other in one process, so the three share the machine's state.
	if o.only["cdc"] {
		for _, c := range cdcBenches {
			say("go test -bench %s ./pkg/outbox/ …", c.pattern)
			got, err := runGoBenches(ctx, root, "./pkg/outbox/", c.pattern, cdcNames(c.name), o.drainEvents, stdout)
			for name, b := range got {
				res.Go[cdcKey(name)] = b
			}
			if err != nil {
				res.Problems = append(res.Problems, fmt.Sprintf("cdc: %v", err))
				say("cdc failed: %v", err)
			}
		}
	}

	k6Parts := o.only["modes"] || o.only["ramp"] || o.only["spike"] || o.only["soak"] || o.only["knobs"]
	if k6Parts {
		if err := runPlatform(ctx, o, &res, getenv, stdout, say); err != nil {
			res.Problems = append(res.Problems, err.Error())
			say("platform runs: %v", err)
		}
	}
	if o.only["peers"] {
		if err := runPeers(ctx, o, &res, getenv, say); err != nil {
			res.Problems = append(res.Problems, err.Error())
			say("peers: %v", err)
		}
	}
	res.Seconds = time.Since(start).Seconds()

	if err := report(o, res, true, stdout, say); err != nil {
		return err
	}
	if len(res.Problems) > 0 {
		return fmt.Errorf("%d part(s) failed: %s", len(res.Problems), strings.Join(res.Problems, "; "))
	}
	return nil
}

// at resolves a path given on the command line against the repository root.
func at(root, path string) string {
	if filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(root, path)
}

func adminURL(getenv func(string) string) string {
	if u := getenv("ONCEFLOW_TEST_PG_URL"); u != "" {
		return u
	}
	return "postgres://postgres:postgres@127.0.0.1:7432/postgres?sslmode=disable"
}

func brokers(getenv func(string) string) []string {
	if b := getenv("ONCEFLOW_TEST_KAFKA_BROKERS"); b != "" {
		return strings.Split(b, ",")
	}
	return []string{"127.0.0.1:7092"}
}

// cdcModes are the relay modes the cdc part compares, as the benchmarks
// name them (mode=table is RELAY_MODE=cdc).
var cdcModes = []string{"poll", "table", "wal"}

// cdcBenches are the cdc part's benchmarks: each has a sub-benchmark per
// cdcModes entry, and the results are kept in Results.Go as cdcKey names.
var cdcBenches = []struct{ pattern, name string }{
	{"^BenchmarkCDCWriteOverhead$", "BenchmarkCDCWriteOverhead"},
	{"^BenchmarkCDCDrain$", "BenchmarkCDCDrain"},
	{"^BenchmarkCDCPublishLag$", "BenchmarkCDCPublishLag"},
}

func cdcNames(bench string) []string {
	var names []string
	for _, m := range cdcModes {
		names = append(names, bench+"/mode="+m)
	}
	return names
}

// cdcKey is a cdc result's key in Results.Go:
// "BenchmarkCDCDrain/mode=wal" is "cdc-drain-wal".
func cdcKey(name string) string {
	bench, mode, _ := strings.Cut(strings.TrimPrefix(name, "BenchmarkCDC"), "/mode=")
	kind := map[string]string{"WriteOverhead": "write", "Drain": "drain", "PublishLag": "lag"}[bench]
	return "cdc-" + kind + "-" + mode
}

// runGoBench runs one benchmark once (-benchtime 1x: each is a whole
// experiment that reports its own rates) and parses its reported metrics.
func runGoBench(ctx context.Context, root, pkg, pattern, want string, drainEvents int, stdout io.Writer) (GoBench, error) {
	got, err := runGoBenches(ctx, root, pkg, pattern, []string{want}, drainEvents, stdout)
	return got[want], err
}

// runGoBenches runs the benchmarks pattern matches once each and returns
// the results named in want; one missing is an error, but the others found
// are returned with it. drainEvents reaches the drain benchmarks as
// ONCEFLOW_BENCH_DRAIN_EVENTS.
func runGoBenches(ctx context.Context, root, pkg, pattern string, want []string, drainEvents int, stdout io.Writer) (map[string]GoBench, error) {
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", pattern, "-benchtime", "1x", "-timeout", "15m", pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "ONCEFLOW_BENCH_DRAIN_EVENTS="+strconv.Itoa(drainEvents))
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); pw.Close() }()
	got := map[string]GoBench{}
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(stdout, "    "+line)
		if name, m, ok := parseBenchLine(line); ok && contains(want, name) {
			got[name] = GoBench{Name: name, Metrics: m}
		}
	}
	if err := <-done; err != nil {
		return got, fmt.Errorf("go test -bench %s %s: %w", pattern, pkg, err)
	}
	for _, name := range want {
		if _, ok := got[name]; !ok {
			return got, fmt.Errorf("go test -bench %s %s printed no result for %s", pattern, pkg, name)
		}
	}
	return got, nil
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

// parseBenchLine reads "BenchmarkX-2  1  12.5 unit  3 other-unit …".
func parseBenchLine(line string) (string, map[string]float64, bool) {
	m := benchLine.FindStringSubmatch(line)
	if m == nil {
		return "", nil, false
	}
	fields := strings.Fields(m[2])
	metrics := map[string]float64{}
	for i := 0; i+1 < len(fields); i += 2 {
		v, err := strconv.ParseFloat(fields[i], 64)
		if err != nil {
			return "", nil, false
		}
		metrics[fields[i+1]] = v
	}
	return m[1], metrics, len(metrics) > 0
}

// side is which programs a k6 run starts: the working tree's, or the -base
// revision's.
type side struct {
	name   string // "" for the working tree, "base"
	binDir string
}

// loadShape tells how a scenario offered its load, so that the databases'
// timestamps can be cut into windows afterwards.
type loadShape struct {
	rate  float64       // a steady rate; 0 for the ramp and the spike
	for_  time.Duration // how long the steady rate was held
	steps []float64     // the ramp's steps
	hold  time.Duration // how long the ramp held each step
}

// runPlatform runs the k6 parts, each against a fresh platform; with -base,
// each of modes' outbox run, ramp, spike and soak runs against the base's
// programs too, alternated with the working tree's.
func runPlatform(ctx context.Context, o options, res *Results, getenv func(string) string, stdout io.Writer, say func(string, ...any)) error {
	k6 := filepath.Join(o.root, "bin", "k6")
	if _, err := os.Stat(k6); err != nil {
		return fmt.Errorf("the project's k6 is missing: run `make k6` (make bench does): %w", err)
	}
	work := side{binDir: filepath.Join(o.root, "bin", "bench")}
	say("building the platform's programs into %s …", work.binDir)
	if err := rig.Build(ctx, o.root, work.binDir); err != nil {
		return err
	}
	sides := []side{work}
	if o.base != "" {
		base, rev, err := buildBase(ctx, o.root, o.base, say)
		if err != nil {
			return err
		}
		res.Base = rev
		sides = append(sides, base)
	}
	servers := rig.FindServers(ctx, adminURL(getenv), brokers(getenv))
	for _, m := range servers.Missing {
		res.Problems = append(res.Problems, "CPU by pid: "+m+" (left out of the CPU figures)")
	}
	workRoot := filepath.Join(o.root, "bin", "bench", "work")
	n := 0
	stmtProblem := false
	scenario := func(key string, sd side, round int, script string, knob variant, shape loadShape, vars ...string) (*rig.Platform, rig.Report, error) {
		n++
		label := key
		if sd.name != "" {
			label = key + "@" + sd.name
		}
		name := fmt.Sprintf("bench_%s_%d_%d", strings.NewReplacer("=", "_", "-", "_", "@", "_").Replace(label), os.Getpid(), n)
		// The working tree's programs listen on port 0 and log the bound
		// addresses; a -base revision's may predate that "listening" line, so
		// they get ports picked in advance (racy, but only for old binaries).
		dbSettings := knob.dbSettings
		if o.commitDelayUs > 0 {
			// commit_siblings 0: the delay comes before every flush, not
			// only when five other transactions are open.
			dbSettings = append(slices.Clone(dbSettings), fmt.Sprintf("commit_delay = %d", o.commitDelayUs), "commit_siblings = 0")
			res.CommitDelayUs = o.commitDelayUs
		}
		p, err := rig.Start(ctx, rig.Config{
			PrePickPorts: sd.name != "",
			BinDir:       sd.binDir, WorkDir: filepath.Join(workRoot, label), PostgresURL: adminURL(getenv),
			Brokers: brokers(getenv), Name: name, Env: knob.env, Partitions: knob.partitions, DatabaseSettings: dbSettings,
			DatabaseParams: knob.dbParams,
		})
		if err != nil {
			return nil, rig.Report{}, fmt.Errorf("%s: %w", label, err)
		}
		if err := p.Warm(ctx); err != nil {
			p.Stop()
			p.Destroy(context.WithoutCancel(ctx))
			return nil, rig.Report{}, fmt.Errorf("%s: %w", label, err)
		}
		say("k6 %s (%s)%s …", filepath.Base(script), strings.Join(vars, " "), map[bool]string{true: " against " + o.base, false: ""}[sd.name != ""])
		// An overloaded run drains for minutes; only a stall should end the wait.
		vars = append(vars, "DRAIN_TIMEOUT_MS=300000")
		stmtErr := resetStatements(ctx, adminURL(getenv))
		if stmtErr != nil && !stmtProblem {
			stmtProblem = true
			res.Problems = append(res.Problems, "statements per order: pg_stat_statements is not loaded (a stack from before devstack/stack.sh preloaded it: make down && make up): "+stmtErr.Error())
		}
		smp := startSampler(p, servers, adminURL(getenv), time.Second)
		profiled := profileDuring(ctx, o, p, label, shape, say)
		r, err := rig.K6(ctx, k6, filepath.Join(o.root, "loadtest", "k6", script), p, indent(stdout), vars...)
		samples := smp.finish()
		profiles := profiled()
		var stmts map[string]float64
		var topStmts []stmtStat
		if stmtErr == nil && err == nil {
			dbs := map[string]string{"orders": p.OrdersDB, "billing": p.BillingDB, "shim": p.ShimDB}
			if stmts, topStmts, stmtErr = readStatements(ctx, adminURL(getenv), dbs, r.OrdersPlaced); stmtErr != nil {
				res.Problems = append(res.Problems, fmt.Sprintf("%s: statements per order: %v", label, stmtErr))
			}
		}
		if err != nil {
			p.Stop()
			p.Destroy(context.WithoutCancel(ctx))
			return nil, r, fmt.Errorf("%s: %w", label, err)
		}
		if !knob.notInResults {
			run := Run{Key: key, Side: sd.name, Round: round, K6: r, Profiles: profiles, StatementsPerOrder: stmts, TopStatements: topStmts}
			if err := measureRun(ctx, p, &run, shape, samples); err != nil {
				res.Problems = append(res.Problems, fmt.Sprintf("%s: measuring: %v", label, err))
			}
			res.Runs = append(res.Runs, run)
			if sd.name == "" && round == 0 {
				res.K6[key] = r
			}
		}
		if r.ExitCode != 0 {
			// A broken invariant fails make bench; a scenario's lag or backlog
			// threshold is a goal missed, which the table already reports.
			// The base's failures are the base's: reported, never ours.
			msg := fmt.Sprintf("%s: k6 exited %d (%s)", label, r.ExitCode, strings.Join(r.ThresholdsFailed, "; "))
			if brokeInvariant(r) && sd.name == "" {
				res.Problems = append(res.Problems, msg)
			} else {
				res.Missed = append(res.Missed, msg)
			}
		}
		return p, r, nil
	}
	done := func(p *rig.Platform) {
		p.Stop()
		p.Destroy(context.WithoutCancel(ctx))
	}
	// abRun runs one scenario against every side, rounds times, alternating
	// which side goes first (A B, B A, …) so that a machine drifting over
	// the run weighs on both alike. after sees the working tree's first run.
	abRun := func(key, script string, shape loadShape, after func(*rig.Platform) error, vars ...string) error {
		rounds := 1
		if len(sides) > 1 {
			rounds = o.abRounds
		}
		for round := range rounds {
			order := sides
			if round%2 == 1 {
				order = []side{sides[1], sides[0]}
			}
			for _, sd := range order {
				p, _, err := scenario(key, sd, round, script, variant{}, shape, vars...)
				if err != nil {
					return err
				}
				if after != nil && sd.name == "" && round == 0 {
					if err := after(p); err != nil {
						res.Problems = append(res.Problems, err.Error())
					}
				}
				done(p)
			}
		}
		return nil
	}
	rate := strconv.Itoa(o.rate)
	steady, err := time.ParseDuration(o.steadyDuration)
	if err != nil {
		return fmt.Errorf("-steady-duration: %w", err)
	}

	if o.only["modes"] {
		err := abRun("outbox", "steady.js", loadShape{rate: float64(o.rate), for_: steady}, func(p *rig.Platform) error {
			var err error
			if res.Lag, err = lagSeries(ctx, p); err != nil {
				return fmt.Errorf("reading the steady run's lag series: %w", err)
			}
			return nil
		}, "RATE="+rate, "DURATION="+o.steadyDuration)
		if err != nil {
			return err
		}
		if naiveAvailable(o.root) {
			p, _, err := scenario("naive", work, 0, "steady.js", variant{env: map[string][]string{
				"orders": {"PUBLISH_MODE=naive"}, "billing": {"INBOX_MODE=naive"},
			}}, loadShape{rate: float64(o.rate), for_: steady}, "RATE="+rate, "DURATION="+o.steadyDuration)
			if err != nil {
				return err
			}
			done(p)
		} else {
			res.Problems = append(res.Problems, "naive mode: this checkout's orders service has no PUBLISH_MODE (the naive dual-write mode is not merged yet)")
		}
	}
	if o.only["ramp"] {
		steps, err := parseSteps(o.steps)
		if err != nil {
			return err
		}
		hold, err := time.ParseDuration(o.stepDuration)
		if err != nil {
			return fmt.Errorf("-step-duration: %w", err)
		}
		if err := abRun("ramp", "ramp.js", loadShape{steps: steps, hold: hold}, nil, "STEPS="+o.steps, "STEP_DURATION="+o.stepDuration); err != nil {
			return err
		}
	}
	if o.only["spike"] {
		if err := abRun("spike", "spike.js", loadShape{}, nil, "SPIKE_RATE="+strconv.Itoa(o.spikeRate)); err != nil {
			return err
		}
	}
	if o.only["soak"] {
		// Half the knee; without a knee (nothing met the lag budget), a rate
		// low enough that the soak measures time, not overload. The base
		// gets the same rate, so that its figures compare.
		soakRate := 50
		if r, ok := res.K6["ramp"]; ok && r.Knee > 0 {
			soakRate = int(r.Knee) / 2
		}
		soakRate = max(soakRate, 50)
		soak, err := time.ParseDuration(o.soakDuration)
		if err != nil {
			return fmt.Errorf("-soak-duration: %w", err)
		}
		if err := abRun("soak", "soak.js", loadShape{rate: float64(soakRate), for_: soak}, nil,
			"SOAK_RATE="+strconv.Itoa(soakRate), "SOAK_DURATION="+o.soakDuration); err != nil {
			return err
		}
	}
	if o.only["knobs"] {
		// One setting at a time against the defaults, which run first and
		// last so drift on a shared machine shows.
		variants := []variant{
			{name: "default"},
			{name: "pool_max_conns=16", dbParams: "pool_max_conns=16"},
			{name: "partitions=12", partitions: 12},
			{name: "synchronous_commit=off", dbSettings: []string{"synchronous_commit = off"}},
			{name: "default"},
		}
		for _, v := range variants {
			v.notInResults = true
			p, r, err := scenario("knob-"+v.name, work, 0, "steady.js", v, loadShape{}, "RATE="+strconv.Itoa(o.knobRate), "DURATION="+o.steadyDuration)
			if err != nil {
				return err
			}
			done(p)
			res.Knobs = append(res.Knobs, Knob{Name: v.name, Report: r})
		}
	}
	return nil
}

// parseSteps reads -steps, "100,200,…".
func parseSteps(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("-steps: %q is not a rate", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// variant is a platform setting a run changes.
type variant struct {
	name         string
	env          map[string][]string
	partitions   int
	dbSettings   []string
	dbParams     string
	notInResults bool // a knob run: kept in Results.Knobs instead of K6
}

// Knob is one run of the knobs part.
type Knob struct {
	Name   string     `json:"name"`
	Report rig.Report `json:"report"`
}

// brokeInvariant reports whether a failed threshold of r is an invariant's
// (lib.js, invariantThresholds), or k6 failed for another reason.
func brokeInvariant(r rig.Report) bool {
	if len(r.ThresholdsFailed) == 0 {
		return true
	}
	for _, t := range r.ThresholdsFailed {
		if !strings.HasPrefix(t, "settle_lag") && !strings.HasPrefix(t, "orders_unsettled") {
			return true
		}
	}
	return false
}

// naiveAvailable reports whether this checkout's orders service knows the
// naive dual-write mode the comparison needs.
func naiveAvailable(root string) bool {
	b, err := os.ReadFile(filepath.Join(root, "services", "orders", "cmd", "orders", "run.go"))
	return err == nil && strings.Contains(string(b), "PUBLISH_MODE")
}

// LagPoint is one second of the steady run: the lags of the orders placed
// in that second.
type LagPoint struct {
	Second int     `json:"second"`
	Orders int     `json:"orders"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
	MaxMs  float64 `json:"maxMs"`
}

// lagSeries reads every order's commit and settlement times straight from
// the orders and shim databases and groups the lags by the second the
// order was placed in.
func lagSeries(ctx context.Context, p *rig.Platform) ([]LagPoint, error) {
	settledAt := map[string]time.Time{}
	if err := query(ctx, p.ShimDB, `SELECT order_id::text, min(forwarded_at) FROM forwards WHERE kind = 'capture' GROUP BY order_id`,
		func(r pgx.Rows) error {
			var id string
			var at time.Time
			if err := r.Scan(&id, &at); err != nil {
				return err
			}
			settledAt[id] = at
			return nil
		}); err != nil {
		return nil, err
	}
	type placed struct {
		at  time.Time
		lag time.Duration
	}
	var orders []placed
	if err := query(ctx, p.OrdersDB, `SELECT id::text, created_at FROM orders WHERE customer_id <> 'warm-up' ORDER BY created_at`,
		func(r pgx.Rows) error {
			var id string
			var at time.Time
			if err := r.Scan(&id, &at); err != nil {
				return err
			}
			if s, ok := settledAt[id]; ok {
				orders = append(orders, placed{at, s.Sub(at)})
			}
			return nil
		}); err != nil {
		return nil, err
	}
	if len(orders) == 0 {
		return nil, errors.New("no settled orders")
	}
	t0 := orders[0].at
	var series []LagPoint
	var bucket []float64
	sec := 0
	flush := func() {
		if len(bucket) > 0 {
			sortFloats(bucket)
			series = append(series, LagPoint{Second: sec, Orders: len(bucket),
				P50Ms: quantile(bucket, 0.5), P99Ms: quantile(bucket, 0.99), MaxMs: bucket[len(bucket)-1]})
		}
		bucket = bucket[:0]
	}
	for _, o := range orders {
		s := int(o.at.Sub(t0) / time.Second)
		if s != sec {
			flush()
			sec = s
		}
		bucket = append(bucket, float64(o.lag.Microseconds())/1000)
	}
	flush()
	return series, nil
}

func query(ctx context.Context, url, sql string, each func(pgx.Rows) error) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// indent prefixes each line k6 prints, so it reads as part of a step.
func indent(w io.Writer) io.Writer { return &prefixWriter{w: w} }

type prefixWriter struct {
	w       io.Writer
	partial []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		if _, err := fmt.Fprintf(p.w, "    %s\n", p.partial[:i]); err != nil {
			return 0, err
		}
		p.partial = p.partial[i+1:]
	}
}
