package prove

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgutil"
)

// ordering: one aggregate gets HotEvents events, interleaved with many other
// aggregates' events, written in small transactions while three relays (three
// orders processes) publish them and one relay is killed -9 mid-run; a
// consumer with four inbox workers records the order it handles them in.
// Every aggregate's versions must arrive as 1, 2, 3, … with nothing missing.
func (h *Harness) ordering(ctx context.Context, _ bool) Row {
	var row Row
	relays := 3
	if h.relayMode == "debezium" {
		relays = 1 // orders runs no relay there: Kafka Connect is the one killed
	}
	p, err := h.newPlatform(ctx, "ordering", Setup{Relays: relays, NoDownstream: true})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()

	// The recorder: the real inbox, four workers, on a database of its own
	// (the unused billing one), recording what its handler sees, in order.
	pool := p.billingPool
	if err := pgutil.Migrate(pool, pgutil.Migration{FS: inbox.Migrations, Table: inbox.MigrationsTable}); err != nil {
		return fail(row, err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE arrivals (seq bigserial PRIMARY KEY, aggregate_id text NOT NULL, version bigint NOT NULL)`); err != nil {
		return fail(row, err)
	}
	brokers := h.stack.Brokers()
	src := inbox.GroupConfig{Brokers: brokers, Topic: p.OrdersTopic, Group: "ordering-audit"}
	dlq := kafkautil.NewWriter(brokers, 10)
	defer dlq.Close()
	reg := prometheus.NewRegistry()
	metrics := inbox.NewMetrics(reg)
	recorder, err := inbox.NewConsumer(pool, src, dlq, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		_, err := tx.Exec(ctx, `INSERT INTO arrivals (aggregate_id, version) VALUES ($1, $2)`, ev.AggregateID, ev.AggregateVersion)
		return err
	}, inbox.Config{Name: "ordering-audit", Workers: 4, DisableVersionGuard: true, Metrics: metrics,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		return fail(row, err)
	}
	rctx, stop := context.WithCancel(ctx)
	recorded := make(chan error, 1)
	go func() { recorded <- recorder.Run(rctx) }()
	defer func() { stop(); <-recorded }()

	// The schedule: the hot aggregate's versions shuffled in among the others', each
	// aggregate's own versions in order.
	hot := "hot-" + uuid.NewString()
	next := map[string]int64{hot: 0}
	want := map[string]int64{hot: int64(h.prof.HotEvents)}
	var pending []string
	for range h.prof.HotEvents {
		pending = append(pending, hot)
	}
	for range h.prof.Others {
		id := uuid.NewString()
		want[id] = int64(h.prof.OtherEvents)
		for range h.prof.OtherEvents {
			pending = append(pending, id)
		}
	}
	rand.Shuffle(len(pending), func(i, j int) { pending[i], pending[j] = pending[j], pending[i] })
	total := len(pending)
	h.logf("  writing %d events (%d on aggregate %s) in transactions of 10, three relays publishing …", total, h.prof.HotEvents, hot)
	write := cdc.Write(outbox.RelayMode(p.relayMode())) // Emit in wal mode
	var (
		killed    *Proc
		restarted chan error // Kafka Connect's start after its kill (debezium)
	)
	for i := 0; i < total; i += 10 {
		batch := pending[i:min(i+10, total)]
		err := pgx.BeginFunc(ctx, p.ordersPool, func(tx pgx.Tx) error {
			for _, agg := range batch {
				next[agg]++
				body, _ := json.Marshal(map[string]any{"n": next[agg]})
				if err := write(ctx, tx, event.Envelope{EventID: uuid.New(), EventType: "ProofTick", EventVersion: 1,
					AggregateType: "order", AggregateID: agg, AggregateVersion: next[agg], OccurredAt: time.Now(),
					CorrelationID: "ordering", Payload: body}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fail(row, fmt.Errorf("writing events: %w", err))
		}
		if p.Connect != nil && restarted == nil && i >= total*2/5 {
			h.logf("  kill -9 Kafka Connect (Debezium) mid-run, then start it again")
			if err := p.Connect.Kill(ctx); err != nil {
				return fail(row, err)
			}
			restarted = make(chan error, 1)
			go func() { restarted <- p.Connect.Restart(ctx) }()
		}
		if p.Connect == nil && killed == nil && i >= total*2/5 {
			victim := p.Orders[1]
			if p.relayMode() != "poll" {
				victim = p.streamingRelay() // one relay streams, the others stand by: kill the one that matters
			}
			h.logf("  kill -9 %s mid-run", victim.Name)
			victim.Kill()
			killed = victim
		}
		if i%50 == 0 {
			select {
			case <-ctx.Done():
				return fail(row, ctx.Err())
			case <-time.After(20 * time.Millisecond): // spread the writes over the relays' rebalancing
			}
		}
	}
	if restarted != nil {
		if err := <-restarted; err != nil {
			return fail(row, fmt.Errorf("starting Kafka Connect again: %w", err))
		}
	}
	var got int
	err = waitUntil(ctx, 5*time.Minute, func() bool {
		return pool.QueryRow(ctx, `SELECT count(*) FROM arrivals`).Scan(&got) == nil && got >= total
	})
	h.logf("  %d of %d events handled", got, total)
	if err != nil {
		row.Error = fmt.Sprintf("only %d of %d events arrived within 5 minutes", got, total)
	}
	outOfOrder, lost, err := auditArrivals(ctx, pool, want)
	if err != nil {
		return fail(row, err)
	}
	row.Faults = 0
	row.FaultsDesc = fmt.Sprintf("kill -9 of 1 of 3 relays after %d of %d events were written", total*2/5, total)
	switch {
	case p.Connect != nil:
		row.Faults = p.Connect.Kills()
		row.FaultsDesc = fmt.Sprintf("kill -9 of Kafka Connect (Debezium) after %d of %d events were written", total*2/5, total)
	case killed != nil:
		row.Faults = killed.Crashes()
	}
	row.Orders, row.OutOfOrder, row.Lost = total, outOfOrder, lost
	row.Absorbed = int(counterValue(reg, "inbox_duplicates_total"))
	row.check(row.Faults == 1, "one relay was killed mid-run (%d)", row.Faults)
	row.check(outOfOrder == 0, "every aggregate's versions were handled in order, the hot one's %d included (%d out of order)", h.prof.HotEvents, outOfOrder)
	row.check(lost == 0, "every event was handled (%d missing)", lost)
	return row
}

// counterValue sums the samples of the counter name in g (0 when absent).
func counterValue(g prometheus.Gatherer, name string) float64 {
	families, _ := g.Gather()
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// auditArrivals replays the recorded arrivals: an arrival whose version is
// not the aggregate's previous one plus one is out of order.
func auditArrivals(ctx context.Context, pool *pgxpool.Pool, want map[string]int64) (outOfOrder, lost int, err error) {
	rows, err := pool.Query(ctx, `SELECT aggregate_id, version FROM arrivals ORDER BY seq`)
	if err != nil {
		return 0, 0, err
	}
	last := map[string]int64{}
	seen := map[string]int64{}
	var agg string
	var v int64
	_, err = pgx.ForEachRow(rows, []any{&agg, &v}, func() error {
		if v != last[agg]+1 {
			outOfOrder++
		}
		if v > last[agg] {
			last[agg] = v
		}
		seen[agg]++
		return nil
	})
	for id, n := range want {
		if seen[id] < n {
			lost += int(n - seen[id])
		}
	}
	return outOfOrder, lost, err
}

// streamingRelay is the orders process whose log-based relay holds the
// replication slot now (outbox_slot_active 1); the first one if none says so.
func (p *Platform) streamingRelay() *Proc {
	for _, pr := range p.Orders {
		if m, err := pr.Metrics(); err == nil && m["outbox_slot_active"] == 1 {
			return pr
		}
	}
	return p.Orders[0]
}
