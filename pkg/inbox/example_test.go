package inbox_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Kafka delivers an event three times; the handler's side effect happens once
// and the two redeliveries are counted as duplicates.
func ExampleNewConsumer() {
	ctx := context.Background()
	pool, brokers, topic, cleanup := exampleSetup(ctx)
	defer cleanup()

	ev := event.Envelope{
		EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
		AggregateID: "order-1", AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{"amountCents":500}`),
	}
	w := testenv.NewWriter(brokers, 10)
	defer w.Close()
	for range 3 {
		_ = w.WriteMessages(ctx, event.ToKafka(topic, ev))
	}

	// The handler's writes commit with the inbox row, or not at all.
	charge := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, ev.AggregateID)
		return err
	}
	// Every instance of the service joins the same group; the group spreads
	// the topic's partitions among them.
	src := inbox.GroupConfig{Brokers: brokers, Topic: topic, Group: topic + "-group"}
	reg := prometheus.NewRegistry()
	metrics := inbox.NewMetrics(reg)
	c, err := inbox.NewConsumer(pool, src, w, charge, inbox.Config{Name: "billing", Metrics: metrics})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); <-time.After(20 * time.Millisecond) {
		if counter(reg, "inbox_duplicates_total") == 2 {
			break
		}
	}
	stop()
	fmt.Println("run:", <-done)

	var charges int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&charges)
	fmt.Println("charges:", charges, "duplicates:", counter(reg, "inbox_duplicates_total"))
	// Output:
	// run: <nil>
	// charges: 1 duplicates: 2
}

// counter reads the counter name from reg, as Prometheus would scrape it.
func counter(reg prometheus.Gatherer, name string) float64 {
	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// exampleSetup makes a fresh database with a charges table and the inbox
// schema, and a fresh topic with its dead-letter topic, on the dev stack.
func exampleSetup(ctx context.Context) (*pgxpool.Pool, []string, string, func()) {
	return testenv.ForExample(ctx, `CREATE TABLE charges (order_id text PRIMARY KEY)`,
		[]testenv.Migration{{FS: inbox.Migrations, Table: inbox.MigrationsTable}}, ".dlt")
}
