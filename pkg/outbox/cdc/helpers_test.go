package cdc_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// adminDB returns a pool on a fresh database with the outbox schema.
func adminDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return newOutboxDB(t)
}

// row is one outbox row of a scenario, in the state the relay would have
// left it in.
type row struct {
	aggType, aggID string
	version        int64
	state          string        // pending, published or dead
	publishedAgo   time.Duration // published rows: published_at = now() - publishedAgo
	createdAt      time.Time     // zero: the insert time
}

// seeded is where a row landed.
type seeded struct {
	id      int64
	eventID uuid.UUID
}

// seedRows enqueues one event per row in one transaction (so ids follow the
// order of rows), then forces each into its state.
func seedRows(t *testing.T, pool *pgxpool.Pool, rows ...row) []seeded {
	t.Helper()
	ctx := context.Background()
	evs := make([]event.Envelope, len(rows))
	for i, r := range rows {
		evs[i] = event.Envelope{
			EventID: uuid.New(), EventType: "ThingHappened", EventVersion: 1,
			AggregateType: r.aggType, AggregateID: r.aggID, AggregateVersion: r.version,
			OccurredAt: time.Now(), Payload: []byte(`{"n":1}`),
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.EnqueueBatch(ctx, tx, evs...) }); err != nil {
		t.Fatalf("enqueuing: %v", err)
	}
	out := make([]seeded, len(rows))
	for i, r := range rows {
		var createdAt any
		if !r.createdAt.IsZero() {
			createdAt = r.createdAt
		}
		err := pool.QueryRow(ctx, `
			UPDATE outbox_events SET
			    state = $2,
			    attempts = CASE $2 WHEN 'pending' THEN 0 WHEN 'published' THEN 1 ELSE 3 END,
			    next_attempt_at = CASE $2 WHEN 'dead' THEN now() ELSE next_attempt_at END,
			    last_error = CASE $2 WHEN 'dead' THEN 'broker said no' END,
			    published_at = CASE $2 WHEN 'published' THEN now() - $3::bigint * interval '1 microsecond' END,
			    created_at = coalesce($4::timestamptz, created_at)
			WHERE event_id = $1
			RETURNING id`, evs[i].EventID, r.state, r.publishedAgo.Microseconds(), createdAt).Scan(&out[i].id)
		if err != nil {
			t.Fatalf("seeding row %d: %v", i, err)
		}
		out[i].eventID = evs[i].EventID
	}
	return out
}

// idsOf returns the ids of the seeded rows at the given indexes.
func idsOf(s []seeded, idx ...int) []int64 {
	ids := []int64{}
	for _, i := range idx {
		ids = append(ids, s[i].id)
	}
	return ids
}

// tableIDs returns the ids of table's rows matching where, in order.
func tableIDs(t *testing.T, pool *pgxpool.Pool, table, where string, args ...any) []int64 {
	t.Helper()
	return testenv.QueryColumn[int64](t, pool, "SELECT id FROM "+table+" WHERE "+where+" ORDER BY id", args...)
}

func equalIDs(t *testing.T, what string, got, want []int64) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: ids %v, want %v", what, got, want)
	}
}

const (
	day  = 24 * time.Hour
	week = 7 * day
)

// benchCountingPool opens a pool on url whose connections count their round
// trips, statements and claims in counts; the relay's lock connection, dialed
// from the same config, counts too.
func benchCountingPool(b testing.TB, url string, maxConns int32, counts *benchWireCounts) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = maxConns
	dialer := &net.Dialer{KeepAlive: 5 * time.Minute}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &benchCountingConn{Conn: c, counts: counts}, nil
	}
	cfg.ConnConfig.Tracer = counts
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatalf("opening pool: %v", err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// benchWireCounts counts what a pool's connections send: round trips (as
// benchCountingConn sees them) and statements, claims among them (as a
// pgx tracer sees them, single or pipelined).
type benchWireCounts struct {
	roundTrips, statements, claims atomic.Int64
}

type benchWireSnapshot struct{ roundTrips, statements, claims int64 }

func (c *benchWireCounts) snapshot() benchWireSnapshot {
	return benchWireSnapshot{c.roundTrips.Load(), c.statements.Load(), c.claims.Load()}
}

func (s benchWireSnapshot) minus(o benchWireSnapshot) benchWireSnapshot {
	return benchWireSnapshot{s.roundTrips - o.roundTrips, s.statements - o.statements, s.claims - o.claims}
}

func (c *benchWireCounts) statement(sql string) {
	c.statements.Add(1)
	if strings.Contains(sql, "FOR UPDATE OF o") {
		c.claims.Add(1)
	}
}

func (c *benchWireCounts) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.statement(data.SQL)
	return ctx
}

func (c *benchWireCounts) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *benchWireCounts) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *benchWireCounts) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.statement(data.SQL)
}

func (c *benchWireCounts) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// benchCountingConn counts a round trip whenever it writes after having read
// (or writes first): however many writes a client makes before it waits for
// the answer, the wait is one.
type benchCountingConn struct {
	net.Conn
	counts *benchWireCounts
	mu     sync.Mutex
	read   bool
	wrote  bool
}

func (c *benchCountingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.read || !c.wrote {
		c.counts.roundTrips.Add(1)
	}
	c.read, c.wrote = false, true
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *benchCountingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.read = true
		c.mu.Unlock()
	}
	return n, err
}

// benchRate accumulates events over time.
type benchRate struct {
	events  int
	elapsed time.Duration
}

func (r *benchRate) add(n int, d time.Duration) { r.events += n; r.elapsed += d }

func (r *benchRate) perSecond() float64 { return float64(r.events) / r.elapsed.Seconds() }

const (
	lagLoad      = 6 * time.Second // of commits at the benchmark's rate
	lagWarmUp    = 500 * time.Millisecond
	lagProducers = 4
	lagIdle      = 2 * time.Second
)

// benchTrickle commits n events, one per transaction written with write, at
// rate per second on a fixed schedule (an open loop: a slow commit does not
// slow the schedule), and records in committed when each transaction's
// Commit returned.
func benchTrickle(ctx context.Context, pool *pgxpool.Pool, write cdc.WriteFunc, rate, n int, committed *benchClock) ([]string, error) {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	due := make(chan int, n)
	go func() {
		defer close(due)
		start := time.Now()
		for i := range n {
			// An open-loop schedule: event i is due at start + i/rate.
			<-time.After(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
			due <- i
		}
	}()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for range lagProducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range due {
				ev := benchOrderPlaced("order-"+strconv.Itoa(i), 1, i)
				ev.EventID = uuid.MustParse(ids[i])
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return write(ctx, tx, ev) })
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					continue
				}
				committed.mark(ids[i], time.Now())
			}
		}()
	}
	wg.Wait()
	return ids, firstErr
}

// benchClock records a time per event id.
type benchClock struct {
	mu sync.Mutex
	at map[string]time.Time
}

func newBenchClock() *benchClock { return &benchClock{at: map[string]time.Time{}} }

// mark keeps the first time of an id: a redelivery is not a later arrival.
func (c *benchClock) mark(id string, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.at[id]; !ok {
		c.at[id] = t
	}
}

func (c *benchClock) hasAll(ids []string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if _, ok := c.at[id]; !ok {
			return false
		}
	}
	return true
}

// lagsUntil returns, per id, the time from c's mark to later's. A negative
// lag (the ack observed before the committing goroutine read the clock) is 0.
func (c *benchClock) lagsUntil(later *benchClock, ids []string) []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	later.mu.Lock()
	defer later.mu.Unlock()
	lags := make([]time.Duration, 0, len(ids))
	for _, id := range ids {
		lags = append(lags, max(0, later.at[id].Sub(c.at[id])))
	}
	return lags
}

// intervals returns the times between the successive distinct marks of ids:
// for acks under a steady load, how long each relay batch took end to end.
func (c *benchClock) intervals(ids []string) []time.Duration {
	c.mu.Lock()
	var at []time.Time
	for _, id := range ids {
		at = append(at, c.at[id])
	}
	c.mu.Unlock()
	slices.SortFunc(at, time.Time.Compare)
	at = slices.Compact(at)
	var ds []time.Duration
	for i := 1; i < len(at); i++ {
		ds = append(ds, at[i].Sub(at[i-1]))
	}
	return ds
}

// benchLogger keeps the relays' routine messages out of the results.
var benchLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// benchOrderPlaced is an event the size of a real one: a small payload, a
// correlation id and a trace context.
func benchOrderPlaced(orderID string, version int64, n int) event.Envelope {
	payload, _ := json.Marshal(map[string]any{
		"orderId": orderID, "customerId": "customer-" + strconv.Itoa(n%977),
		"amountCents": 1000 + n%5000, "currency": "EUR",
	})
	return event.Envelope{
		EventID:          event.NewID(),
		EventType:        "OrderPlaced",
		EventVersion:     1,
		AggregateType:    "order",
		AggregateID:      orderID,
		AggregateVersion: version,
		OccurredAt:       time.Now(),
		CorrelationID:    uuid.NewString(),
		Traceparent:      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Payload:          payload,
	}
}

type nopWriter struct{}

func (nopWriter) WriteMessages(context.Context, ...kafka.Message) error { return nil }

// firstMessage reads the first message of the example's one-partition topic,
// as any Kafka consumer would.
func firstMessage(ctx context.Context, brokers []string, topic string) (kafka.Message, error) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return r.ReadMessage(ctx)
}

// exampleSetup makes a fresh database with an orders table and the outbox
// schema, and a fresh one-partition topic, on the dev stack (`make up`).
func exampleSetup(ctx context.Context) (*pgxpool.Pool, []string, string, func()) {
	return testenv.ForExample(ctx, `CREATE TABLE orders (id uuid PRIMARY KEY, amount_cents bigint NOT NULL)`,
		[]testenv.Migration{{FS: outbox.Migrations, Table: outbox.MigrationsTable}})
}

// switchWriter forwards to whichever writer is current and counts the writes,
// so a test can take Kafka away from a relay and give it back.
type switchWriter struct {
	current atomic.Pointer[testenv.Writer]
	writes  atomic.Int64
}

func (s *switchWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	s.writes.Add(1)
	return s.current.Load().WriteMessages(ctx, msgs...)
}

// runRelay runs relay until the test ends, failing it if Run returns early
// or with an error.
func runRelay(t *testing.T, relay *outbox.Relay) {
	t.Helper()
	testenv.RunInBackground(t, "Run", relay.Run)
}

// relayEnv is what most relay tests start from: a fresh outbox database, a
// topic with a collector reading it, and a writer to the brokers.
type relayEnv struct {
	brokers []string
	topic   string
	url     string // the database's
	pool    *pgxpool.Pool
	c       *collector
	w       *testenv.Writer
}

// newRelayEnv makes a relayEnv with a topic of the given partitions and a
// writer of the given batch size, closed when the test ends.
func newRelayEnv(t *testing.T, partitions, batchSize int) *relayEnv {
	t.Helper()
	e := &relayEnv{brokers: testenv.KafkaBrokers(t)}
	e.topic = testenv.NewTopic(t, e.brokers, partitions)
	e.url = newOutboxDBURL(t)
	e.pool = testenv.NewPool(t, e.url)
	e.c = collect(t, e.brokers, e.topic)
	e.w = testenv.NewWriter(e.brokers, batchSize)
	t.Cleanup(func() { e.w.Close() })
	return e
}

// topicFn routes every event to the env's topic (RelayConfig.Topic).
func (e *relayEnv) topicFn(string) string { return e.topic }

// countingPool opens a second pool on the env's database whose connections
// count their claims, statements and round trips, for the relay under test:
// a test of what the relay costs Postgres need not take its word for it.
func (e *relayEnv) countingPool(t *testing.T) (*pgxpool.Pool, *benchWireCounts) {
	t.Helper()
	counts := &benchWireCounts{}
	return benchCountingPool(t, e.url, 4, counts), counts
}

// newOutboxDB returns a pool on a fresh database with the outbox schema.
func newOutboxDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return testenv.NewPool(t, newOutboxDBURL(t))
}

// newOutboxDBURL returns the URL of a fresh database with the outbox schema.
func newOutboxDBURL(t *testing.T) string {
	t.Helper()
	return testenv.NewMigratedDatabase(t, testenv.Migration{FS: outbox.Migrations, Table: outbox.MigrationsTable})
}

func newEvent(aggregateID string, version int64) event.Envelope {
	return event.Envelope{
		EventID:          uuid.New(),
		EventType:        "ThingHappened",
		EventVersion:     1,
		AggregateType:    "thing",
		AggregateID:      aggregateID,
		AggregateVersion: version,
		OccurredAt:       time.Now(),
		CorrelationID:    "corr-1",
		Payload:          []byte(`{"n":1}`),
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, where string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_events WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The holdback tests make the broker or the writer refuse a message for its
// size, then let it through as an operator would: a topic of newSmallTopic
// refuses an event whose payload is blob(…, bigBlob) until raiseTopicMax;
// kafka-go's writer refuses a message over its BatchBytes (1 MiB by default,
// 4 MiB in newWideWriter).
const bigBlob = 200 << 10

// newSmallTopic creates a one-partition topic that refuses messages over
// 100 KiB (max.message.bytes).
func newSmallTopic(t *testing.T, brokers []string) string {
	t.Helper()
	return newTopicWithMax(t, brokers, 100<<10)
}

// newTopicWithMax creates a one-partition topic for this test that refuses
// messages over max bytes, and deletes it when the test ends.
func newTopicWithMax(t *testing.T, brokers []string, max int) string {
	t.Helper()
	name := testenv.Name("test")
	testenv.NewTopicNamed(t, brokers, name, 1, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: fmt.Sprint(max)})
	return name
}

// raiseTopicMax lets topic take messages up to 4 MiB, as an operator would.
func raiseTopicMax(t *testing.T, brokers []string, topic string) {
	t.Helper()
	setTopicConfig(t, brokers, topic, "max.message.bytes", fmt.Sprint(4<<20))
}

// newWideWriter returns a writer that takes messages up to 4 MiB; the
// caller closes it.
func newWideWriter(brokers []string) *testenv.Writer {
	w := testenv.NewWriter(brokers, 10)
	w.BatchBytes = 4 << 20
	return w
}

// blob returns a JSON payload holding n bytes of c.
func blob(c string, n int) []byte {
	return []byte(`{"blob":"` + strings.Repeat(c, n) + `"}`)
}

// onTopic reads partition 0 of topic from its start to its current end and
// returns each message as aggregate/version, in offset order.
func onTopic(t *testing.T, brokers []string, topic string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, 0)
	if err != nil {
		t.Fatalf("dialing the leader of %s: %v", topic, err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	offset, end, err := conn.ReadOffsets()
	if err != nil {
		t.Fatalf("reading the offsets of %s: %v", topic, err)
	}
	got := []string{}
	for offset < end {
		if _, err := conn.Seek(offset, kafka.SeekAbsolute); err != nil {
			t.Fatalf("seeking %s to %d: %v", topic, offset, err)
		}
		b := conn.ReadBatchWith(kafka.ReadBatchConfig{MinBytes: 1, MaxBytes: 16 << 20, MaxWait: time.Second})
		for {
			m, err := b.ReadMessage()
			if err != nil {
				break
			}
			ev, err := event.FromKafka(m)
			if err != nil {
				t.Fatalf("undecodable message at offset %d: %v", m.Offset, err)
			}
			got = append(got, fmt.Sprintf("%s/%d", ev.AggregateID, ev.AggregateVersion))
			offset = m.Offset + 1
		}
		if err := b.Close(); err != nil {
			t.Fatalf("reading %s at %d: %v", topic, offset, err)
		}
	}
	return got
}

// setTopicConfig changes one setting of topic, as an operator would.
func setTopicConfig(t *testing.T, brokers []string, topic, name, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctrl, err := testenv.Controller(ctx, brokers)
	if err != nil {
		t.Fatal(err)
	}
	addr := ctrl.RemoteAddr()
	ctrl.Close()
	c := &kafka.Client{Addr: kafka.TCP(addr.String())}
	res, err := c.AlterConfigs(ctx, &kafka.AlterConfigsRequest{Addr: addr, Resources: []kafka.AlterConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic,
		Configs: []kafka.AlterConfigRequestConfig{{Name: name, Value: value}},
	}}})
	if err != nil {
		t.Fatalf("setting %s of %s: %v", name, topic, err)
	}
	for _, err := range res.Errors {
		if err != nil {
			t.Fatalf("setting %s of %s: %v", name, topic, err)
		}
	}
}

// enqueue commits events in one transaction.
func enqueue(t *testing.T, pool *pgxpool.Pool, evs ...event.Envelope) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return outbox.EnqueueBatch(context.Background(), tx, evs...)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// collector reads a topic from the start, keeping the first delivery of each
// event id (as an inbox would) and counting redeliveries.
type collector struct {
	mu         sync.Mutex
	seen       map[uuid.UUID]bool
	order      map[string][]int64 // aggregate id -> versions, first deliveries only
	duplicates int
}

func collect(t *testing.T, brokers []string, topic string) *collector {
	t.Helper()
	c := &collector{seen: map[uuid.UUID]bool{}, order: map[string][]int64{}}
	testenv.ReadEvents(t, brokers, topic, func(ev event.Envelope) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.seen[ev.EventID] {
			c.duplicates++
			return
		}
		c.seen[ev.EventID] = true
		c.order[ev.AggregateID] = append(c.order[ev.AggregateID], ev.AggregateVersion)
	})
	return c
}

func (c *collector) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

func (c *collector) dups() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.duplicates
}

// checkOrder fails unless every aggregate's versions arrived as 1, 2, … want[id].
func (c *collector) checkOrder(t *testing.T, want map[string]int64) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range want {
		got := c.order[id]
		if int64(len(got)) != n {
			t.Errorf("aggregate %s: %d versions arrived, want %d", id, len(got), n)
			continue
		}
		for i, v := range got {
			if v != int64(i+1) {
				t.Errorf("aggregate %s: arrival %d is version %d, want %d (order broken)", id, i, v, i+1)
				break
			}
		}
	}
}
