package prove

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// Profile sizes a run.
type Profile struct {
	Name string
	// Orders is the least number of orders each load proof places.
	Orders int
	// Crashes is the least number of SIGKILLs each crash proof injects.
	Crashes int
	// ConnectKills is how many times relay-crash SIGKILLs Kafka Connect in
	// RELAY_MODE=debezium (each kill is followed by a JVM start, seconds
	// where the platform's relays restart in milliseconds).
	ConnectKills int
	// Redeliveries is how often redelivery re-produces each event.
	Redeliveries int
	// HotEvents go to the one aggregate of the ordering proof; Others
	// aggregates get OtherEvents each, interleaved with them.
	HotEvents, Others, OtherEvents int
	// Poison is the number of each kind of poison message.
	Poison int
	// ShimCrashes are the shim's crashes after the third-party call (chaos).
	ShimCrashes int
	// Stable is how long nothing may change before a run that never
	// completes (a naive mode lost something) counts as quiet.
	Stable time.Duration

	// Scale is the scale-out proof's size: at least Changes membership
	// changes (SIGKILLs, graceful stops, restarts, added instances), one
	// every Every, under Rate orders/s.
	Scale ScaleProfile
	// Outage is the kafka-outage proof's size.
	Outage OutageProfile
	// Busy is the busy-relay proof's size.
	Busy BusyProfile
	// NemesisDuration is how long the nemesis's faults run under load
	// (NEMESIS_DURATION overrides it).
	NemesisDuration time.Duration
}

// ScaleProfile sizes the scale-out proof.
type ScaleProfile struct {
	Changes int
	Every   time.Duration
	Rate    int
}

// OutageProfile sizes the kafka-outage proof: Kafka down for Kafka, then
// Restarts broker restarts RestartEvery apart, then PostgreSQL down for
// Postgres, all under Rate orders/s.
type OutageProfile struct {
	Kafka, Postgres time.Duration
	Restarts        int
	RestartEvery    time.Duration
	Rate            int
}

// BusyProfile sizes the busy-relay proof: with Kafka slowed, the relay's
// oldest pending age must pass Age seconds within Within, under Rate
// orders/s, with the Kafka link limited to KBps per connection upstream.
type BusyProfile struct {
	Age    float64
	Within time.Duration
	Rate   int
	KBps   int
}

// Profiles: quick runs in `make test`, full in `make prove`.
var Profiles = map[string]Profile{
	"quick": {Name: "quick", Orders: 30, Crashes: 3, ConnectKills: 2, Redeliveries: 10, HotEvents: 1000, Others: 50, OtherEvents: 4,
		Poison: 2, ShimCrashes: 1, Stable: 8 * time.Second,
		Scale:           ScaleProfile{Changes: 8, Every: 3 * time.Second, Rate: 20},
		Outage:          OutageProfile{Kafka: 20 * time.Second, Postgres: 10 * time.Second, Restarts: 1, RestartEvery: 20 * time.Second, Rate: 10},
		Busy:            BusyProfile{Age: 10, Within: 60 * time.Second, Rate: 40, KBps: 3},
		NemesisDuration: 45 * time.Second},
	"full": {Name: "full", Orders: 300, Crashes: 20, ConnectKills: 5, Redeliveries: 10, HotEvents: 1000, Others: 300, OtherEvents: 5,
		Poison: 10, ShimCrashes: 3, Stable: 20 * time.Second,
		Scale:           ScaleProfile{Changes: 24, Every: 8 * time.Second, Rate: 30},
		Outage:          OutageProfile{Kafka: 3 * time.Minute, Postgres: time.Minute, Restarts: 3, RestartEvery: 20 * time.Second, Rate: 20},
		Busy:            BusyProfile{Age: 20, Within: 60 * time.Second, Rate: 45, KBps: 3},
		NemesisDuration: 10 * time.Minute},
}

// Proof is one named proof; naive says whether it also runs in a naive mode.
type Proof struct {
	Name  string
	Naive string // the naive mode's label, "" if none
	run   func(h *Harness, ctx context.Context, naive bool) Row
	// Exclusive proofs change the shared stack itself (restart or stop
	// Kafka or PostgreSQL, poison the proxies every platform goes through):
	// they run alone, after the others.
	Exclusive bool
}

// Proofs in the order they are reported.
var Proofs = []Proof{
	{"atomicity", "naive publish (dual write)", (*Harness).atomicity, false},
	{"relay-crash", "naive consumer (no inbox)", (*Harness).relayCrash, false},
	{"redelivery", "naive consumer (no inbox)", (*Harness).redelivery, false},
	{"ordering", "", (*Harness).ordering, false},
	{"replay", "", (*Harness).replay, false},
	{"backlog", "", (*Harness).backlog, false},
	{"poison", "", (*Harness).poison, false},
	{"chaos", "", (*Harness).chaos, true},
	{"scale-out", "", (*Harness).scaleOut, true},
	{"kafka-outage", "", (*Harness).kafkaOutage, true},
	{"busy-relay", "", (*Harness).busyRelay, true},
	{"nemesis", "", (*Harness).nemesis, true},
}

// RelayModeProofs are the proofs that run once per Options.RelayModes:
// the ones whose faults are about the producing side. In RELAY_MODE=debezium
// only those of DebeziumProofs run.
var RelayModeProofs = map[string]bool{"atomicity": true, "relay-crash": true, "ordering": true, "chaos": true, "nemesis": true}

// Options configure Run.
type Options struct {
	// Root is the repository root (where go.work is).
	Root string
	// Dir holds the harness's stack, binaries, logs and reports. Default Root/.prove.
	Dir     string
	Profile Profile
	// Only runs the named proofs. Empty: all.
	Only []string
	// RelayModes are the relay modes (RELAY_MODE: poll, cdc, wal, debezium)
	// that the proofs about publishing (RelayModeProofs; in debezium, those
	// of DebeziumProofs) run in, one row each; the other proofs and the
	// naive modes run with poll, and so does a relay-mode proof none of
	// RelayModes runs. Default: poll.
	RelayModes []string
	// Parallel is how many runs of the proofs that leave the shared stack
	// alone (not Exclusive) go at once, each on its own platform (its own
	// databases, topics, consumer groups and processes). Above 1, the
	// Exclusive proofs also run meanwhile, on Parallel-1 stacks of their
	// own, one at a time on each. Default 1: everything one after the other
	// on one stack.
	Parallel int
	// Nemesis configures the nemesis proof (seed, duration, fault kinds).
	Nemesis NemesisOptions
	// PGReplication gives the harness's Postgres a streaming standby,
	// asynchronous or synchronous (PG_REPLICATION=async|sync), which the
	// nemesis's pgfailover fault promotes. Default none.
	PGReplication PGReplication
	// PublishReplicated runs the services with OUTBOX_PUBLISH_REPLICATED
	// and INBOX_COMMIT_REPLICATED (PUBLISH_REPLICATED=1): their relays
	// publish only what the standby flushed, and their consumers commit
	// offsets only for work the standby flushed. Default off.
	PublishReplicated bool
	// Out receives progress.
	Out io.Writer
}

// Harness runs proofs against its own stack.
type Harness struct {
	opts  Options
	dir   string
	runID string
	bins  map[string]string
	stack *Stack
	prof  Profile
	// relayMode is the RELAY_MODE of the proof this copy runs.
	relayMode string
	// tag prefixes this copy's lines when runs go side by side.
	tag string
	// rolesMu serializes creating the server's roles, which every
	// platform of the run shares.
	rolesMu *sync.Mutex
}

func (h *Harness) logf(format string, args ...any) {
	fmt.Fprintf(h.opts.Out, "%s  %s%s\n", time.Now().Format("15:04:05"), h.tag, fmt.Sprintf(format, args...))
}

// job is one row of the report: a proof in one mode.
type job struct {
	proof     Proof
	naive     bool
	relayMode string
}

// Run builds the programs, starts the stack, runs the proofs and returns
// the report (also written to Dir/runs/<id>/report.{json,md}).
func Run(ctx context.Context, opts Options) (*Report, error) {
	if opts.Dir == "" {
		opts.Dir = filepath.Join(opts.Root, ".prove")
	}
	if opts.Out == nil {
		opts.Out = os.Stdout
	}
	if len(opts.RelayModes) == 0 {
		opts.RelayModes = []string{"poll"}
	}
	for _, m := range opts.RelayModes {
		if _, err := outbox.ParseRelayMode(m); err != nil {
			return nil, err
		}
	}
	for _, name := range opts.Only {
		if !slices.ContainsFunc(Proofs, func(p Proof) bool { return p.Name == name }) {
			return nil, fmt.Errorf("no proof named %q (there are %s)", name, proofNames())
		}
	}
	opts.Parallel = max(opts.Parallel, 1)
	h := &Harness{opts: opts, dir: opts.Dir, prof: opts.Profile, rolesMu: &sync.Mutex{},
		runID: time.Now().UTC().Format("20060102t150405")}
	start := time.Now()
	rep := &Report{Profile: opts.Profile.Name, Started: start,
		Machine: fmt.Sprintf("%d CPUs, %s/%s, %s", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())}
	var err error
	if h.bins, err = build(ctx, opts.Root, opts.Dir, h.logf); err != nil {
		return nil, err
	}
	brokers, err := ParseTopology(opts.Nemesis.Topology)
	if err != nil {
		return nil, err
	}
	if h.stack, err = StartStackWith(ctx, opts.Root, filepath.Join(opts.Dir, "stack"), h.bins["toxiproxy"], h.logf,
		StackOptions{PGReplication: opts.PGReplication, KafkaBrokers: brokers}); err != nil {
		return nil, err
	}
	defer h.stack.Close()
	stopLeftConnects(ctx, opts.Root, opts.Dir)
	h.stack.dropOldDatabases(ctx)
	var jobs []job
	for _, p := range Proofs {
		if len(opts.Only) > 0 && !slices.Contains(opts.Only, p.Name) {
			continue
		}
		if RelayModeProofs[p.Name] {
			n := len(jobs)
			for _, m := range opts.RelayModes {
				if m == string(outbox.ModeDebezium) && !DebeziumProofs[p.Name] {
					h.logf("%s does not run in RELAY_MODE=debezium (its faults target the platform's own relays, not Kafka Connect)", p.Name)
					continue
				}
				jobs = append(jobs, job{p, false, m})
			}
			if len(jobs) == n {
				h.logf("%s runs in RELAY_MODE=poll instead", p.Name)
				jobs = append(jobs, job{p, false, "poll"})
			}
		} else {
			jobs = append(jobs, job{p, false, "poll"})
		}
		if p.Naive != "" {
			jobs = append(jobs, job{p, true, "poll"})
		}
	}
	rows := make([]Row, len(jobs))
	// The proofs that leave the stack alone run opts.Parallel at a time.
	// An exclusive one runs with nothing beside it on its stack: after the
	// others on the same stack, or, when runs go side by side anyway, at the
	// same time as the others on stacks of their own, opts.Parallel-1 of
	// them, each running its share one by one (the machine's cores are
	// shared either way; the proofs spend most of their time waiting out
	// faults and quiet windows).
	exclusive := make(chan int, len(jobs))
	for i, j := range jobs {
		if j.proof.Exclusive {
			exclusive <- i
		}
	}
	close(exclusive)
	runExclusive := func(stack *Stack) {
		for i := range exclusive {
			if ctx.Err() == nil {
				rows[i] = h.runJob(ctx, stack, jobs[i])
			}
		}
	}
	var others sync.WaitGroup
	if opts.Parallel > 1 {
		for n := range min(opts.Parallel-1, len(exclusive)) {
			others.Add(1)
			go func() {
				defer others.Done()
				stack, err := StartStackWith(ctx, opts.Root, filepath.Join(opts.Dir, fmt.Sprintf("stack-exclusive-%d", n+1)), h.bins["toxiproxy"], h.logf,
					StackOptions{KafkaBrokers: brokers})
				if err != nil {
					for i := range exclusive {
						rows[i] = Row{Proof: jobs[i].proof.Name, Mode: "outbox+inbox", Error: fmt.Sprintf("starting a stack for it: %v", err)}
						rows[i].settle()
					}
					return
				}
				defer stack.Close()
				stack.dropOldDatabases(ctx)
				runExclusive(stack)
			}()
		}
	}
	// Workers take the jobs in their order, so the slowest proofs, listed
	// first among those that share the stack, start first.
	queue := make(chan int, len(jobs))
	for i, j := range jobs {
		if !j.proof.Exclusive {
			queue <- i
		}
	}
	close(queue)
	var wg sync.WaitGroup
	for range opts.Parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range queue {
				if ctx.Err() == nil {
					rows[i] = h.runJob(ctx, h.stack, jobs[i])
				}
			}
		}()
	}
	wg.Wait()
	runExclusive(h.stack) // those left: every one when Parallel is 1
	others.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	rep.Rows = rows
	rep.Seconds = time.Since(start).Seconds()
	rep.finish()
	dir := filepath.Join(opts.Dir, "runs", h.runID)
	jsonPath, mdPath, err := rep.Write(dir)
	if err != nil {
		return rep, err
	}
	h.logf("report: %s and %s (service logs beside them)", jsonPath, mdPath)
	return rep, nil
}

// runJob runs one proof in one mode on a copy of h using stack, and logs
// its row.
func (h *Harness) runJob(ctx context.Context, stack *Stack, j job) Row {
	mode := "outbox+inbox"
	if j.naive {
		mode = j.proof.Naive
	}
	if j.relayMode != "poll" {
		mode += ", RELAY_MODE=" + j.relayMode
	}
	hj := *h
	hj.relayMode, hj.stack = j.relayMode, stack
	if h.opts.Parallel > 1 {
		hj.tag = fmt.Sprintf("[%s, %s] ", j.proof.Name, mode)
	}
	hj.logf("── %s (%s) ──", j.proof.Name, mode)
	began := time.Now()
	row := j.proof.run(&hj, ctx, j.naive)
	row.Proof, row.Mode, row.Naive = j.proof.Name, mode, j.naive
	row.Seconds = time.Since(began).Seconds()
	row.settle()
	hj.logf("%s (%s): %s in %.0fs — faults %d, orders %d, lost %d, duplicated %d, out of order %d, absorbed %d, recovery %s%s",
		j.proof.Name, mode, row.Status, row.Seconds, row.Faults, row.Orders, row.Lost, row.Duplicated, row.OutOfOrder, row.Absorbed,
		recovery(row.RecoverySeconds), errSuffix(row.Error))
	for _, what := range row.Broken() {
		hj.logf("   broken: %s", what)
	}
	return row
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " — error: " + e
}

func proofNames() string {
	names := make([]string, len(Proofs))
	for i, p := range Proofs {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// dropOldDatabases removes the databases of earlier runs, and first the
// replication slots a killed run left in them (a database with a logical
// slot cannot be dropped).
func (s *Stack) dropOldDatabases(ctx context.Context) {
	_, _ = s.Admin.Exec(ctx, `SELECT pg_drop_replication_slot(s.slot_name) FROM pg_replication_slots s
		WHERE s.database LIKE 'prove\_%' AND NOT s.active`)
	rows, err := s.Admin.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE 'prove\_%'`)
	if err != nil {
		return
	}
	var names []string
	for rows.Next() {
		var n string
		if rows.Scan(&n) == nil {
			names = append(names, n)
		}
	}
	rows.Close()
	for _, n := range names {
		_, _ = s.Admin.Exec(ctx, `DROP DATABASE IF EXISTS "`+n+`" WITH (FORCE)`)
	}
}
