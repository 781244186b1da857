// Package outboxtesting holds the test helpers that package outbox's
// tests, and those of its sub-packages (cdc, outboxadmin), share: fresh
// outbox databases and rows seeded in a chosen state, events, topics that
// refuse large messages, a collector that reads a topic as an inbox would,
// the relay test environment, and the benchmarks' counting pool, clock and
// load. Only _test.go files import it: it links package testing.
package outboxtesting

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

// Row is one outbox row of a scenario, in the state the relay would have
// left it in.
type Row struct {
	AggType, AggID string
	Version        int64
	State          string        // pending, published or dead
	PublishedAgo   time.Duration // published rows: published_at = now() - publishedAgo
	CreatedAt      time.Time     // zero: the insert time
}

// Seeded is where a row landed.
type Seeded struct {
	ID      int64
	EventID uuid.UUID
}

// SeedRows enqueues one event per row in one transaction (so ids follow the
// order of rows), then forces each into its state.
func SeedRows(t *testing.T, pool *pgxpool.Pool, rows ...Row) []Seeded {
	t.Helper()
	ctx := context.Background()
	evs := make([]event.Envelope, len(rows))
	for i, r := range rows {
		evs[i] = event.Envelope{
			EventID: uuid.New(), EventType: "ThingHappened", EventVersion: 1,
			AggregateType: r.AggType, AggregateID: r.AggID, AggregateVersion: r.Version,
			OccurredAt: time.Now(), Payload: []byte(`{"n":1}`),
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.EnqueueBatch(ctx, tx, evs...) }); err != nil {
		t.Fatalf("enqueuing: %v", err)
	}
	out := make([]Seeded, len(rows))
	for i, r := range rows {
		var createdAt any
		if !r.CreatedAt.IsZero() {
			createdAt = r.CreatedAt
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
			RETURNING id`, evs[i].EventID, r.State, r.PublishedAgo.Microseconds(), createdAt).Scan(&out[i].ID)
		if err != nil {
			t.Fatalf("seeding row %d: %v", i, err)
		}
		out[i].EventID = evs[i].EventID
	}
	return out
}

// IDsOf returns the ids of the seeded rows at the given indexes.
func IDsOf(s []Seeded, idx ...int) []int64 {
	ids := []int64{}
	for _, i := range idx {
		ids = append(ids, s[i].ID)
	}
	return ids
}

// TableIDs returns the ids of table's rows matching where, in order.
func TableIDs(t *testing.T, pool *pgxpool.Pool, table, where string, args ...any) []int64 {
	t.Helper()
	return testenv.QueryColumn[int64](t, pool, "SELECT id FROM "+table+" WHERE "+where+" ORDER BY id", args...)
}

// Snapshot renders table's rows matching where, every column, as JSON, so
// a test can tell whether anything at all changed.
func Snapshot(t *testing.T, pool *pgxpool.Pool, table, where string, args ...any) string {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(),
		"SELECT coalesce(jsonb_agg(to_jsonb(r) - 'archived_at' ORDER BY id)::text, '[]') FROM "+table+" r WHERE "+where,
		args...).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// EqualIDs fails t unless got and want hold the same ids in the same order.
func EqualIDs(t *testing.T, what string, got, want []int64) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: ids %v, want %v", what, got, want)
	}
}

// Ages, for rows seeded in the past.
const (
	Day  = 24 * time.Hour
	Week = 7 * Day
)

// CountingPool opens a pool on url whose connections count their round
// trips, statements and claims in counts; the relay's lock connection, dialed
// from the same config, counts too.
func CountingPool(b testing.TB, url string, maxConns int32, counts *WireCounts) *pgxpool.Pool {
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
		return &countingConn{Conn: c, counts: counts}, nil
	}
	cfg.ConnConfig.Tracer = counts
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatalf("opening pool: %v", err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// WireCounts counts what a pool's connections send: round trips (as
// countingConn sees them) and statements, claims among them (as a
// pgx tracer sees them, single or pipelined).
type WireCounts struct {
	RoundTrips, Statements, Claims atomic.Int64
}

// WireSnapshot is what WireCounts counted up to a moment.
type WireSnapshot struct{ RoundTrips, Statements, Claims int64 }

// Snapshot reads the counts now.
func (c *WireCounts) Snapshot() WireSnapshot {
	return WireSnapshot{c.RoundTrips.Load(), c.Statements.Load(), c.Claims.Load()}
}

// Minus is what was counted between o and s.
func (s WireSnapshot) Minus(o WireSnapshot) WireSnapshot {
	return WireSnapshot{s.RoundTrips - o.RoundTrips, s.Statements - o.Statements, s.Claims - o.Claims}
}

func (c *WireCounts) statement(sql string) {
	c.Statements.Add(1)
	if strings.Contains(sql, "FOR UPDATE OF o") {
		c.Claims.Add(1)
	}
}

func (c *WireCounts) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.statement(data.SQL)
	return ctx
}

func (c *WireCounts) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *WireCounts) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *WireCounts) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.statement(data.SQL)
}

func (c *WireCounts) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// countingConn counts a round trip whenever it writes after having read
// (or writes first): however many writes a client makes before it waits for
// the answer, the wait is one.
type countingConn struct {
	net.Conn
	counts *WireCounts
	mu     sync.Mutex
	read   bool
	wrote  bool
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.read || !c.wrote {
		c.counts.RoundTrips.Add(1)
	}
	c.read, c.wrote = false, true
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.read = true
		c.mu.Unlock()
	}
	return n, err
}

// Rate accumulates events over time.
type Rate struct {
	Events  int
	Elapsed time.Duration
}

// Add counts n events over d.
func (r *Rate) Add(n int, d time.Duration) { r.Events += n; r.Elapsed += d }

// PerSecond is the rate over everything added.
func (r *Rate) PerSecond() float64 { return float64(r.Events) / r.Elapsed.Seconds() }

// The publish-lag benchmarks' load (Trickle).
const (
	LagLoad      = 6 * time.Second // of commits at the benchmark's rate
	LagWarmUp    = 500 * time.Millisecond
	LagProducers = 4
	LagIdle      = 2 * time.Second
)

// Trickle commits n events, one per transaction written with write, at
// rate per second on a fixed schedule (an open loop: a slow commit does not
// slow the schedule), and records in committed when each transaction's
// Commit returned.
func Trickle(ctx context.Context, pool *pgxpool.Pool, write cdc.WriteFunc, rate, n int, committed *Clock) ([]string, error) {
	return TrickleFrom(ctx, pool, write, rate, n, LagProducers, committed)
}

// TrickleFrom is Trickle with producers committing connections: a rate
// above what LagProducers commit one after the other (a few thousand a
// second) needs more of them, and pool at least as many connections.
func TrickleFrom(ctx context.Context, pool *pgxpool.Pool, write cdc.WriteFunc, rate, n, producers int, committed *Clock) ([]string, error) {
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
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range due {
				ev := OrderPlaced("order-"+strconv.Itoa(i), 1, i)
				ev.EventID = uuid.MustParse(ids[i])
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return write(ctx, tx, ev) })
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					continue
				}
				committed.Mark(ids[i], time.Now())
			}
		}()
	}
	wg.Wait()
	return ids, firstErr
}

// Clock records a time per event id.
type Clock struct {
	mu sync.Mutex
	at map[string]time.Time
}

// NewClock returns an empty Clock.
func NewClock() *Clock { return &Clock{at: map[string]time.Time{}} }

// Mark keeps the first time of an id: a redelivery is not a later arrival.
func (c *Clock) Mark(id string, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.at[id]; !ok {
		c.at[id] = t
	}
}

// HasAll reports whether every id has a mark.
func (c *Clock) HasAll(ids []string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if _, ok := c.at[id]; !ok {
			return false
		}
	}
	return true
}

// LagsUntil returns, per id, the time from c's mark to later's. A negative
// lag (the ack observed before the committing goroutine read the clock) is 0.
func (c *Clock) LagsUntil(later *Clock, ids []string) []time.Duration {
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

// Intervals returns the times between the successive distinct marks of ids:
// for acks under a steady load, how long each relay batch took end to end.
func (c *Clock) Intervals(ids []string) []time.Duration {
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

// Logger keeps the relays' routine messages out of the results.
var Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// OrderPlaced is an event the size of a real one: a small payload, a
// correlation id and a trace context.
func OrderPlaced(orderID string, version int64, n int) event.Envelope {
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

// NopWriter accepts every write and sends nothing, for relays that must
// never reach Kafka.
type NopWriter struct{}

func (NopWriter) WriteMessages(context.Context, ...kafka.Message) error { return nil }

// FirstMessage reads the first message of the example's one-partition topic,
// as any Kafka consumer would.
func FirstMessage(ctx context.Context, brokers []string, topic string) (kafka.Message, error) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return r.ReadMessage(ctx)
}

// ExampleSetup makes a fresh database with an orders table and the outbox
// schema, and a fresh one-partition topic, on the dev stack (`make up`).
func ExampleSetup(ctx context.Context) (*pgxpool.Pool, []string, string, func()) {
	return testenv.ForExample(ctx, `CREATE TABLE orders (id uuid PRIMARY KEY, amount_cents bigint NOT NULL)`,
		[]testenv.Migration{{FS: outbox.Migrations, Table: outbox.MigrationsTable}})
}

// SwitchWriter forwards to whichever writer is current and counts the writes,
// so a test can take Kafka away from a relay and give it back.
type SwitchWriter struct {
	Current atomic.Pointer[testenv.Writer]
	Writes  atomic.Int64
}

func (s *SwitchWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	s.Writes.Add(1)
	return s.Current.Load().WriteMessages(ctx, msgs...)
}

// RunRelay runs relay until the test ends, failing it if Run returns early
// or with an error.
func RunRelay(t *testing.T, relay *outbox.Relay) {
	t.Helper()
	testenv.RunInBackground(t, "Run", relay.Run)
}

// RelayEnv is what most relay tests start from: a fresh outbox database, a
// topic with a collector reading it, and a writer to the brokers.
type RelayEnv struct {
	Brokers []string
	Topic   string
	URL     string // the database's
	Pool    *pgxpool.Pool
	C       *Collector
	W       *testenv.Writer
}

// NewRelayEnv makes a relayEnv with a topic of the given partitions and a
// writer of the given batch size, closed when the test ends.
func NewRelayEnv(t *testing.T, partitions, batchSize int) *RelayEnv {
	t.Helper()
	e := &RelayEnv{Brokers: testenv.KafkaBrokers(t)}
	e.Topic = testenv.NewTopic(t, e.Brokers, partitions)
	e.URL = NewOutboxDBURL(t)
	e.Pool = testenv.NewPool(t, e.URL)
	e.C = Collect(t, e.Brokers, e.Topic)
	e.W = testenv.NewWriter(e.Brokers, batchSize)
	t.Cleanup(func() { e.W.Close() })
	return e
}

// TopicFn routes every event to the env's topic (RelayConfig.Topic).
func (e *RelayEnv) TopicFn(string) string { return e.Topic }

// CountingPool opens a second pool on the env's database whose connections
// count their claims, statements and round trips, for the relay under test:
// a test of what the relay costs Postgres need not take its word for it.
func (e *RelayEnv) CountingPool(t *testing.T) (*pgxpool.Pool, *WireCounts) {
	t.Helper()
	counts := &WireCounts{}
	return CountingPool(t, e.URL, 4, counts), counts
}

// NewOutboxDB returns a pool on a fresh database with the outbox schema.
func NewOutboxDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return testenv.NewPool(t, NewOutboxDBURL(t))
}

// NewOutboxDBURL returns the URL of a fresh database with the outbox schema.
func NewOutboxDBURL(t *testing.T) string {
	t.Helper()
	return testenv.NewMigratedDatabase(t, testenv.Migration{FS: outbox.Migrations, Table: outbox.MigrationsTable})
}

// NewEvent is a small ThingHappened event of aggregate "thing" aggregateID
// at version.
func NewEvent(aggregateID string, version int64) event.Envelope {
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

// CountRows counts the outbox rows matching where.
func CountRows(t *testing.T, pool *pgxpool.Pool, where string) int {
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
const BigBlob = 200 << 10

// NewSmallTopic creates a one-partition topic that refuses messages over
// 100 KiB (max.message.bytes).
func NewSmallTopic(t *testing.T, brokers []string) string {
	t.Helper()
	return NewTopicWithMax(t, brokers, 100<<10)
}

// NewTopicWithMax creates a one-partition topic for this test that refuses
// messages over max bytes, and deletes it when the test ends.
func NewTopicWithMax(t *testing.T, brokers []string, max int) string {
	t.Helper()
	name := testenv.Name("test")
	testenv.NewTopicNamed(t, brokers, name, 1, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: fmt.Sprint(max)})
	return name
}

// RaiseTopicMax lets topic take messages up to 4 MiB, as an operator would.
func RaiseTopicMax(t *testing.T, brokers []string, topic string) {
	t.Helper()
	SetTopicConfig(t, brokers, topic, "max.message.bytes", fmt.Sprint(4<<20))
}

// NewWideWriter returns a writer that takes messages up to 4 MiB; the
// caller closes it.
func NewWideWriter(brokers []string) *testenv.Writer {
	w := testenv.NewWriter(brokers, 10)
	w.BatchBytes = 4 << 20
	return w
}

// Blob returns a JSON payload holding n bytes of c.
func Blob(c string, n int) []byte {
	return []byte(`{"blob":"` + strings.Repeat(c, n) + `"}`)
}

// OnTopic reads partition 0 of topic from its start to its current end and
// returns each message as aggregate/version, in offset order.
func OnTopic(t *testing.T, brokers []string, topic string) []string {
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

// SetTopicConfig changes one setting of topic, as an operator would.
func SetTopicConfig(t *testing.T, brokers []string, topic, name, value string) {
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

// Enqueue commits events in one transaction.
func Enqueue(t *testing.T, pool *pgxpool.Pool, evs ...event.Envelope) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return outbox.EnqueueBatch(context.Background(), tx, evs...)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Collector reads a topic from the start, keeping the first delivery of each
// event id (as an inbox would) and counting redeliveries.
type Collector struct {
	mu         sync.Mutex
	seen       map[uuid.UUID]bool
	order      map[string][]int64 // aggregate id -> versions, first deliveries only
	duplicates int
}

// Collect starts a Collector on topic, read until the test ends.
func Collect(t *testing.T, brokers []string, topic string) *Collector {
	t.Helper()
	c := &Collector{seen: map[uuid.UUID]bool{}, order: map[string][]int64{}}
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

// Distinct is how many events arrived, redeliveries not counted.
func (c *Collector) Distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// Has reports whether the collector saw the event.
func (c *Collector) Has(id uuid.UUID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[id]
}

// Dups is how many redeliveries arrived.
func (c *Collector) Dups() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.duplicates
}

// CheckOrder fails unless every aggregate's versions arrived as 1, 2, … want[id].
func (c *Collector) CheckOrder(t *testing.T, want map[string]int64) {
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
