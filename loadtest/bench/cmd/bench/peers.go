package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/loadtest/bench/rig"
	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgutil"
)

// The peers part (`make bench BENCH_ARGS="-only peers"`): the same workload
// through Debezium and through the platform's own log-based relay in table
// (RELAY_MODE=cdc) and WAL-only (RELAY_MODE=wal) modes, on the dev stack,
// each relay its own process, in alternating rounds of one run:
//
//   - debezium: Kafka Connect 3.9.1 with Debezium 3.1.3 and the connector
//     file docs/debezium ships (tuned for latency there: poll.interval.ms 10,
//     max.batch.size 4096, max.queue.size 16384; the worker's producer
//     lingers 5 ms and is idempotent), started by devstack/connect.sh;
//   - cdc and wal: the orders program in that RELAY_MODE (its API idle).
//
// Per relay and round, on a fresh database, slot and topic (topics with
// message.timestamp.type=LogAppendTime, so each record carries the broker's
// append time): a transaction of -drain-events events drained twice (cold,
// the relay's first work since its start; warm, the same again), commit →
// the last record's append time; events paced at each -peers-rates rate
// from 8 connections, one event per transaction, commit → each record's
// append time (p50, p99, max); the relay process's CPU per event (and its
// walsender's, Postgres's decoding of the slot), its peak RSS, and its CPU
// while idle. Before each relay, PostgreSQL's pg_recvlogical drains the same
// two transactions alone on a database and slot of its own: the walsender's
// limit, which each drain is divided by (peers_recv.go). With -peers-big N,
// after the rounds, each relay drains one N-event transaction as a fresh
// process (peers_big.go).

// peerRelays are the relays the part compares, in the first round's order.
var peerRelays = []string{"debezium", "cdc", "wal"}

// peerPartitions is every peer topic's partition count.
const peerPartitions = 6

// peerWriters is how many connections the paced phases commit from.
const peerWriters = 8

// PeerRun is one relay's figures in one round.
type PeerRun struct {
	Relay string `json:"relay"`
	Round int    `json:"round"`
	// DrainCold and DrainWarm are seconds from the commit of a
	// DrainEvents-event transaction to the broker's append of its last record.
	DrainCold   float64 `json:"drainColdSeconds"`
	DrainWarm   float64 `json:"drainWarmSeconds"`
	DrainEvents int     `json:"drainEvents"`
	// RecvCold and RecvWarm are pg_recvlogical's drains of the same
	// transactions (rows, or WAL messages for wal): seconds from the COMMIT
	// to its reading the transaction's COMMIT message.
	RecvCold float64 `json:"recvColdSeconds"`
	RecvWarm float64 `json:"recvWarmSeconds"`
	// Paced are the paced phases, by rate.
	Paced []PeerPaced `json:"paced"`
	// RelayCPUDrain and WalsenderCPUDrain are CPU microseconds per event
	// over both drains; the Paced ones over the paced phases.
	RelayCPUDrain, WalsenderCPUDrain float64
	RelayCPUPaced, WalsenderCPUPaced float64
	// PeakRSS is the relay process's VmHWM at the end, in bytes.
	PeakRSS int64 `json:"peakRSSBytes"`
	// IdleCPU is the relay process's CPU while no event was written, in
	// percent of one core.
	IdleCPU float64 `json:"idleCPUPercent"`
	// StartSeconds is from starting the relay to its streaming.
	StartSeconds float64 `json:"startSeconds"`
}

// PeerPaced is one paced phase: commit → broker append, in milliseconds
// (the append time has millisecond resolution).
type PeerPaced struct {
	Rate   int     `json:"rate"`
	Events int     `json:"events"`
	P50    float64 `json:"p50Ms"`
	P99    float64 `json:"p99Ms"`
	Max    float64 `json:"maxMs"`
	Missed int     `json:"missed"` // events committed but not on the topic
	// RelayCPU and WalsenderCPU are the relay process's and its
	// walsender's CPU microseconds per event over this phase (its wait for
	// the stragglers included): issue 33 judges the relay at each rate,
	// and a low rate's small batches cost more per event than a high one's.
	RelayCPU     float64 `json:"relayCPUUsPerEvent,omitempty"`
	WalsenderCPU float64 `json:"walsenderCPUUsPerEvent,omitempty"`
}

// peerOptions are the part's flags.
type peerOptions struct {
	rounds int
	rates  []int
	paced  time.Duration
	idle   time.Duration
	big    int // events of the one transaction each fresh relay drains (0: none)
}

// runPeers runs the peers part and adds its runs to res.
func runPeers(ctx context.Context, o options, res *Results, getenv func(string) string, say func(string, ...any)) error {
	if err := harness.CheckConnect(ctx, o.root); err != nil {
		return fmt.Errorf("peers: %w (make debezium-jars fetches the jars)", err)
	}
	recvBin, err := findRecvLogical(ctx)
	if err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	binDir := filepath.Join(o.root, "bin", "bench")
	say("peers: building the platform's programs into %s …", binDir)
	bins, err := harness.Build(ctx, o.root, binDir, harness.Orders)
	if err != nil {
		return err
	}
	admin, err := pgxpool.New(ctx, adminURL(getenv))
	if err != nil {
		return err
	}
	defer admin.Close()
	env := peerEnv{o: o, admin: admin, adminURL: adminURL(getenv), brokers: brokers(getenv), ordersBin: bins[harness.Orders.Name],
		recvBin: recvBin, work: filepath.Join(o.root, "bin", "bench", "work", "peers"), say: say}
	for round := range o.peers.rounds {
		order := slices.Clone(peerRelays)
		// Each round starts with the next relay, so that none always runs
		// first (on a cold machine) or last.
		order = append(order[round%len(order):], order[:round%len(order)]...)
		for _, relay := range order {
			say("peers: round %d of %d, %s …", round+1, o.peers.rounds, relay)
			run, err := env.run(ctx, relay, round+1)
			if err != nil {
				return fmt.Errorf("peers: %s, round %d: %w", relay, round+1, err)
			}
			say("peers: %s: drain cold %.2fs, warm %.2fs (pg_recvlogical %.2fs, %.2fs); %s; cpu %.0f µs/event (drain), peak RSS %s, idle %.1f%% of a core",
				relay, run.DrainCold, run.DrainWarm, run.RecvCold, run.RecvWarm, pacedSummary(run.Paced), run.RelayCPUDrain, mib(run.PeakRSS), run.IdleCPU)
			res.Peers = append(res.Peers, run)
		}
	}
	if o.peers.big == 0 {
		return nil
	}
	for _, relay := range peerRelays {
		say("peers: one %d-event transaction, %s as a fresh process …", o.peers.big, relay)
		b, err := env.big(ctx, relay, o.peers.big)
		if err != nil {
			return fmt.Errorf("peers: %s, %d-event transaction: %w", relay, o.peers.big, err)
		}
		say("peers: %s: %.2fs (%.0f events/s), peak RSS %s", relay, b.Seconds, b.rate(), mib(b.PeakRSS))
		res.PeersBig = append(res.PeersBig, b)
	}
	return nil
}

func pacedSummary(ps []PeerPaced) string {
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("%d/s p50 %.0f p99 %.0f max %.0f ms", p.Rate, p.P50, p.P99, p.Max))
	}
	return strings.Join(s, ", ")
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// peerEnv is what every peer run shares.
type peerEnv struct {
	o         options
	admin     *pgxpool.Pool
	adminURL  string
	brokers   []string
	ordersBin string
	recvBin   string // pg_recvlogical
	work      string
	say       func(string, ...any)
}

// peerRelay is a running relay: its process and how to stop it.
type peerRelay struct {
	pid  func() int
	stop func()
}

// peerSession is a relay streaming from a database, slot and topic of its
// own: what run and big measure.
type peerSession struct {
	pool      *pgxpool.Pool
	mode      outbox.RelayMode // what the service writes (see writesOf)
	topic     string
	ends      func() (map[int]int64, error)
	pid       int     // the relay's process
	walsender int     // the slot's walsender
	started   float64 // seconds from starting the relay to its first probe on the topic
	close     func()  // stops the relay, then drops the topic and the database
}

// writesOf is what the service writes for relay: rows (Debezium, cdc) or
// WAL messages only (wal).
func writesOf(relay string) outbox.RelayMode {
	if relay == "wal" {
		return outbox.ModeWAL
	}
	return outbox.ModeCDC
}

// open creates the database and topic called name, starts relay on them
// and returns once a probe event reached the topic.
func (e peerEnv) open(ctx context.Context, relay, name string) (s peerSession, err error) {
	var undo []func()
	s.close = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	dbURL, dropDB, err := e.database(ctx, name)
	if err != nil {
		return s, err
	}
	undo = append(undo, dropDB)
	s.topic = strings.ReplaceAll(name, "_", ".")
	if err := e.topic(ctx, s.topic); err != nil {
		return s, err
	}
	undo = append(undo, func() { e.deleteTopic(s.topic) })
	if s.pool, err = openPool(ctx, dbURL); err != nil {
		return s, err
	}
	undo = append(undo, s.pool.Close)

	began := time.Now()
	rel, err := e.start(ctx, relay, name, dbURL, s.topic)
	if err != nil {
		return s, err
	}
	undo = append(undo, rel.stop)
	if s.walsender, err = e.waitStreaming(ctx, name); err != nil {
		return s, err
	}
	s.mode = writesOf(relay)
	s.ends = func() (map[int]int64, error) { return topicEnds(ctx, e.brokers, s.topic) }
	if err := e.waitFlowing(ctx, s.pool, s.mode, s.ends); err != nil {
		return s, err
	}
	s.started = time.Since(began).Seconds()
	s.pid = rel.pid()
	return s, nil
}

// openPool connects to dbURL with a connection for each paced writer and
// two to spare.
func openPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = peerWriters + 2
	return pgxpool.NewWithConfig(ctx, pcfg)
}

// run measures relay once, on a database, slot and topic of its own, after
// pg_recvlogical drained the same transactions on a database and slot of
// its own (recvDrains).
func (e peerEnv) run(ctx context.Context, relay string, round int) (PeerRun, error) {
	r := PeerRun{Relay: relay, Round: round, DrainEvents: e.o.drainEvents}
	name := fmt.Sprintf("bench_peers_%s_%d_%d", relay, round, os.Getpid())
	var err error
	if r.RecvCold, r.RecvWarm, err = e.recvDrains(ctx, name+"_recv", writesOf(relay), e.o.drainEvents); err != nil {
		return r, fmt.Errorf("pg_recvlogical: %w", err)
	}
	s, err := e.open(ctx, relay, name)
	if err != nil {
		return r, err
	}
	defer s.close()
	r.StartSeconds = s.started

	cpu := func() (relayCPU, walCPU time.Duration) {
		if st, err := rig.ReadProcStat(s.pid); err == nil {
			relayCPU = st.CPU
		}
		if st, err := rig.ReadProcStat(s.walsender); err == nil {
			walCPU = st.CPU
		}
		return relayCPU, walCPU
	}
	perEvent := func(d time.Duration, n int) float64 { return float64(d.Microseconds()) / float64(max(n, 1)) }

	rc0, wc0 := cpu()
	if r.DrainCold, err = e.drain(ctx, s.pool, s.mode, s.topic, e.o.drainEvents, s.ends); err != nil {
		return r, fmt.Errorf("cold drain: %w", err)
	}
	if r.DrainWarm, err = e.drain(ctx, s.pool, s.mode, s.topic, e.o.drainEvents, s.ends); err != nil {
		return r, fmt.Errorf("warm drain: %w", err)
	}
	rc1, wc1 := cpu()
	r.RelayCPUDrain, r.WalsenderCPUDrain = perEvent(rc1-rc0, 2*e.o.drainEvents), perEvent(wc1-wc0, 2*e.o.drainEvents)

	paced := 0
	for _, rate := range e.o.peers.rates {
		rc, wc := cpu()
		p, err := e.paced(ctx, s.pool, cdc.Write(s.mode), s.topic, rate)
		if err != nil {
			return r, fmt.Errorf("paced %d/s: %w", rate, err)
		}
		rcEnd, wcEnd := cpu()
		p.RelayCPU, p.WalsenderCPU = perEvent(rcEnd-rc, p.Events), perEvent(wcEnd-wc, p.Events)
		r.Paced = append(r.Paced, p)
		paced += p.Events
	}
	rc2, wc2 := cpu()
	r.RelayCPUPaced, r.WalsenderCPUPaced = perEvent(rc2-rc1, paced), perEvent(wc2-wc1, paced)

	// Idle: nothing written for the window, after a second to settle.
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(time.Second):
	}
	idle0, _ := cpu()
	idleBegan := time.Now()
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(e.o.peers.idle):
	}
	idle1, _ := cpu()
	r.IdleCPU = 100 * (idle1 - idle0).Seconds() / time.Since(idleBegan).Seconds()
	r.PeakRSS = peakRSS(s.pid)
	return r, nil
}

// database creates a database migrated with the outbox's schema (its
// publication included) and returns its URL and how to drop it (after the
// relay stopped: its slot goes first).
func (e peerEnv) database(ctx context.Context, name string) (string, func(), error) {
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("creating database %s: %w", name, err)
	}
	u, err := url.Parse(e.adminURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			_, _ = e.admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, name)
			var left int
			if e.admin.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1`, name).Scan(&left) == nil && left == 0 {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		_, _ = e.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		drop()
		return "", nil, err
	}
	defer pool.Close()
	if err := pgutil.Migrate(pool, pgutil.Migration{FS: outbox.Migrations, Table: outbox.MigrationsTable}); err != nil {
		drop()
		return "", nil, fmt.Errorf("migrating %s: %w", name, err)
	}
	return u.String(), drop, nil
}

// topic creates a topic whose records carry the broker's append time.
func (e peerEnv) topic(ctx context.Context, name string) error {
	if _, err := kafkautil.EnsureTopics(ctx, kafkautil.Security{}, e.brokers, kafkautil.TopicSpec{Partitions: peerPartitions,
		Configs: []kafka.ConfigEntry{{ConfigName: "message.timestamp.type", ConfigValue: "LogAppendTime"}}}, name); err != nil {
		return fmt.Errorf("creating topic %s: %w", name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return kafkautil.WaitTopicsReady(wctx, e.brokers, name)
}

func (e peerEnv) deleteTopic(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if conn, err := kafkautil.Controller(ctx, e.brokers); err == nil {
		_ = conn.DeleteTopics(name)
		conn.Close()
	}
}

// start starts relay's process on the database at dbURL (slot name, topic).
func (e peerEnv) start(ctx context.Context, relay, name, dbURL, topic string) (peerRelay, error) {
	dir := filepath.Join(e.work, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return peerRelay{}, err
	}
	if relay == "debezium" {
		u, _ := url.Parse(dbURL)
		port, _ := strconv.Atoi(u.Port())
		pw, _ := u.User.Password()
		// The server's superuser has REPLICATION: the bench measures the
		// relay, not the roles (the proofs run it as orders_repl).
		c, err := harness.NewConnect(harness.ConnectConfig{Root: e.o.root, Dir: filepath.Join(dir, "connect"), Brokers: e.brokers,
			DBHost: u.Hostname(), DBPort: port, DBName: name, DBUser: u.User.Username(), DBPassword: pw, Slot: name, Topic: topic})
		if err != nil {
			return peerRelay{}, err
		}
		if err := c.Up(ctx); err != nil {
			_ = c.Down(context.Background())
			return peerRelay{}, err
		}
		return peerRelay{pid: c.Pid, stop: func() { _ = c.Down(context.Background()) }}, nil
	}
	p, err := harness.Start(ctx, harness.Config{Spec: harness.Orders, Bin: e.ordersBin, LogPath: filepath.Join(dir, "orders.log"),
		Env: map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": strings.Join(e.brokers, ","), "ORDERS_TOPIC": topic,
			"RELAY_MODE": relay, "OUTBOX_SLOT": name, "LOG_LEVEL": "warn"}})
	if err != nil {
		return peerRelay{}, err
	}
	return peerRelay{pid: p.Pid, stop: func() { _ = p.Stop(20 * time.Second) }}, nil
}

// waitStreaming waits until a walsender streams from slot and returns its pid.
func (e peerEnv) waitStreaming(ctx context.Context, slot string) (int, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var pid *int32
		err := e.admin.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
		if err == nil && pid != nil {
			return int(*pid), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) && err != nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("nothing streamed from slot %s within 2 minutes", slot)
}

// waitFlowing writes a probe event every second until one reaches the
// topic. A slot is active while it is being created, before its consistent
// point: what commits then is in no stream (the platform's table mode
// republishes it from the table, WAL-only loses it by design), so a drain
// committed as soon as the slot is active measured the gap's replay in cdc
// mode and found nothing in wal mode. Once a probe is on the topic, the
// relay streams what commits next.
func (e peerEnv) waitFlowing(ctx context.Context, pool *pgxpool.Pool, mode outbox.RelayMode, ends func() (map[int]int64, error)) error {
	before, err := ends()
	if err != nil {
		return err
	}
	write := cdc.Write(mode)
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return write(ctx, tx, peerEvent(-1)) }); err != nil {
			return err
		}
		for wait := time.Now().Add(time.Second); time.Now().Before(wait); {
			after, err := ends()
			if err != nil {
				return err
			}
			if totalOf(after) > totalOf(before) {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return errors.New("no probe event reached the topic within 2 minutes of the relay's slot becoming active")
}

// peerEvent is one event of the workload: an order placed.
func peerEvent(n int) event.Envelope {
	id := uuid.New()
	return event.Envelope{EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
		AggregateID: id.String(), AggregateVersion: 1, OccurredAt: time.Now(), CorrelationID: id.String(),
		Payload: json.RawMessage(fmt.Sprintf(`{"orderId":%q,"customerId":"c-%d","amountCents":%d,"currency":"EUR"}`, id, n%100, 100+n%900))}
}

// drain commits n events in one transaction and returns the seconds from
// its COMMIT to the broker's append of the last of them.
func (e peerEnv) drain(ctx context.Context, pool *pgxpool.Pool, mode outbox.RelayMode, topic string, n int, ends func() (map[int]int64, error)) (float64, error) {
	before, err := ends()
	if err != nil {
		return 0, err
	}
	committed, err := commitEvents(ctx, pool, mode, n)
	if err != nil {
		return 0, err
	}
	var after map[int]int64
	limit := drainLimit(n)
	for deadline := committed.Add(limit); ; {
		if after, err = ends(); err != nil {
			return 0, err
		}
		if totalOf(after)-totalOf(before) >= int64(n) {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d of %d events on the topic after %s", totalOf(after)-totalOf(before), n, limit)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	last, err := lastAppend(ctx, e.brokers, topic, before, after)
	if err != nil {
		return 0, err
	}
	return last.Sub(committed).Seconds(), nil
}

// drainLimit is how long a drain of n events may take: 10 minutes per
// 100,000 events, at least 10 minutes.
func drainLimit(n int) time.Duration {
	return 10 * time.Minute * time.Duration(max(1, (n+99_999)/100_000))
}

// commitEvents writes n events of mode in one transaction, commits it and
// returns when its COMMIT was sent (see commitOne).
func commitEvents(ctx context.Context, pool *pgxpool.Pool, mode outbox.RelayMode, n int) (time.Time, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	if mode != outbox.ModeWAL {
		// Rows in batches of 1,000 (one round trip each); Emit has no batch.
		for i := 0; i < n; i += 1000 {
			evs := make([]event.Envelope, 0, 1000)
			for j := i; j < min(i+1000, n); j++ {
				evs = append(evs, peerEvent(j))
			}
			if err := outbox.EnqueueBatch(ctx, tx, evs...); err != nil {
				return time.Time{}, err
			}
		}
	} else {
		for i := range n {
			if err := cdc.Emit(ctx, tx, peerEvent(i)); err != nil {
				return time.Time{}, err
			}
		}
	}
	committed := time.Now()
	return committed, tx.Commit(ctx)
}

// paced commits events at rate per second for the paced duration from
// peerWriters connections, one event per transaction, and measures commit
// → broker append for each.
func (e peerEnv) paced(ctx context.Context, pool *pgxpool.Pool, write cdc.WriteFunc, topic string, rate int) (PeerPaced, error) {
	p := PeerPaced{Rate: rate}
	before, err := topicEnds(ctx, e.brokers, topic)
	if err != nil {
		return p, err
	}
	var (
		mu        sync.Mutex
		committed = map[uuid.UUID]time.Time{}
		firstErr  error
	)
	total := int(float64(rate) * e.o.peers.paced.Seconds())
	interval := time.Second * time.Duration(peerWriters) / time.Duration(rate)
	var wg sync.WaitGroup
	for w := range peerWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pool.Acquire(ctx)
			if err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
				return
			}
			defer conn.Release()
			// The writers start spread over one interval, so that together
			// they commit evenly at rate.
			next := time.Now().Add(interval * time.Duration(w) / peerWriters)
			for i := w; i < total; i += peerWriters {
				if d := time.Until(next); d > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(d):
					}
				}
				next = next.Add(interval)
				ev := peerEvent(i)
				at, err := commitOne(ctx, conn, write, ev)
				mu.Lock()
				if err != nil {
					firstErr = cmpErr(firstErr, err)
				} else {
					committed[ev.EventID] = at
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return p, firstErr
	}
	p.Events = len(committed)
	// Every event on the topic, or a minute's grace for the stragglers.
	var after map[int]int64
	for deadline := time.Now().Add(time.Minute); ; {
		if after, err = topicEnds(ctx, e.brokers, topic); err != nil {
			return p, err
		}
		if totalOf(after)-totalOf(before) >= int64(p.Events) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return p, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	msgs, err := readRange(ctx, e.brokers, topic, before, after)
	if err != nil {
		return p, err
	}
	var lat []float64
	seen := map[uuid.UUID]bool{}
	for _, m := range msgs {
		ev, err := event.FromKafka(m)
		if err != nil || seen[ev.EventID] {
			continue
		}
		at, ok := committed[ev.EventID]
		if !ok {
			continue
		}
		seen[ev.EventID] = true
		lat = append(lat, float64(m.Time.Sub(at).Microseconds())/1000)
	}
	p.Missed = p.Events - len(lat)
	slices.Sort(lat)
	p.P50, p.P99, p.Max = quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 1)
	return p, nil
}

// commitOne writes ev in a transaction of its own and returns when its
// COMMIT was sent: a log-based relay may see the commit before the client
// hears of it (the walsender reads the flushed WAL while the server still
// answers), so the time after COMMIT returns made some latencies negative.
func commitOne(ctx context.Context, conn *pgxpool.Conn, write cdc.WriteFunc, ev event.Envelope) (time.Time, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	if err := write(ctx, tx, ev); err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	return at, tx.Commit(ctx)
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// totalOf sums a topic's end offsets: the records it holds.
func totalOf(m map[int]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// topicEnds is each partition's end offset.
func topicEnds(ctx context.Context, brokers []string, topic string) (map[int]int64, error) {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	parts := make([]int, peerPartitions)
	for p := range parts {
		parts[p] = p
	}
	return kafkautil.EndOffsets(ctx, client, topic, parts)
}

// lastAppend is the latest append time among the records each partition
// gained between before and after: its last one's.
func lastAppend(ctx context.Context, brokers []string, topic string, before, after map[int]int64) (time.Time, error) {
	var last time.Time
	for p, end := range after {
		if end <= before[p] {
			continue
		}
		msgs, err := readRange(ctx, brokers, topic, map[int]int64{p: end - 1}, map[int]int64{p: end})
		if err != nil {
			return last, err
		}
		for _, m := range msgs {
			if m.Time.After(last) {
				last = m.Time
			}
		}
	}
	return last, nil
}

// readRange reads each partition's records from from[p] up to to[p].
func readRange(ctx context.Context, brokers []string, topic string, from, to map[int]int64) ([]kafka.Message, error) {
	return kafkautil.ReadRange(ctx, brokers, topic, from, to, 16<<20, 2*time.Minute)
}

// peakRSS is the process's VmHWM in bytes (0 when unreadable).
func peakRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
