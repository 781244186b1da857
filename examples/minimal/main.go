// Command minimal is the smallest real use of onceflow's libraries, the
// program to start from: it writes an order and its OrderPlaced event in one
// transaction (pkg/outbox), relays the event to Kafka, and consumes it
// through an inbox (pkg/inbox) that records it exactly once.
//
//	go run ./examples/minimal   # against the dev stack (`make up`)
//
// DATABASE_URL and KAFKA_BROKERS point it elsewhere; the role needs to
// create tables (it applies the migrations itself, see docs/adopt.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "minimal:", err)
		os.Exit(1)
	}
}

// The service's own table. The outbox's and inbox's tables come from their
// migrations (outbox.Migrate, inbox.Migrate).
const createTables = `
CREATE TABLE IF NOT EXISTS orders (id uuid PRIMARY KEY, amount_cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS shipments (order_id text PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now());`

const (
	insertOrder    = `INSERT INTO orders (id, amount_cents) VALUES ($1, $2)`
	insertShipment = `INSERT INTO shipments (order_id) VALUES ($1)`
	countShipments = `SELECT count(*) FROM shipments WHERE order_id = $1`
)

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	dbURL := or(getenv("DATABASE_URL"), "postgres://postgres:postgres@127.0.0.1:55432/postgres?sslmode=disable")
	brokers := strings.Split(or(getenv("KAFKA_BROKERS"), "127.0.0.1:59092"), ",")
	topic := or(getenv("TOPIC"), "minimal.orders")
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, createTables); err != nil {
		return fmt.Errorf("creating tables: %w", err)
	}
	if err := createTopics(ctx, brokers, topic, topic+".dlt"); err != nil {
		return err
	}

	// kafka-go's zero Writer acks nothing and waits a second per batch:
	// wait for every in-sync replica, flush at once, and hash keys as
	// Kafka's Java client does, so one aggregate stays on one partition.
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, Balancer: &kafka.Murmur2Balancer{}}
	defer w.Close()

	// 1. The business change and its event commit together, or not at all.
	orderID := event.NewID()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insertOrder, orderID, 1999); err != nil {
			return err
		}
		return outbox.Enqueue(ctx, tx, event.Envelope{
			EventID: event.NewID(), EventType: "OrderPlaced", EventVersion: 1,
			AggregateType: "order", AggregateID: orderID.String(), AggregateVersion: 1,
			OccurredAt: time.Now(), Payload: []byte(fmt.Sprintf(`{"orderId":%q,"amountCents":1999}`, orderID)),
		})
	})
	if err != nil {
		return fmt.Errorf("placing the order: %w", err)
	}
	fmt.Fprintf(stdout, "placed order %s with its OrderPlaced event in one transaction\n", orderID)

	// 2. The relay publishes committed events; 3. the inbox consumes them.
	relay, err := outbox.NewRelay(pool, w, outbox.RelayConfig{
		Topic: func(string) string { return topic }, Logger: logger})
	if err != nil {
		return err
	}
	handle := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		// Runs in the transaction that records the event in the inbox: a
		// redelivery finds that row and never comes here again.
		_, err := tx.Exec(ctx, insertShipment, ev.AggregateID)
		return err
	}
	consumer, err := inbox.NewConsumer(pool,
		inbox.GroupConfig{Brokers: brokers, Topic: topic, Group: "minimal"}, w, handle,
		inbox.Config{Name: "minimal", Logger: logger})
	if err != nil {
		return err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 2)
	go func() { done <- relay.Run(runCtx) }()
	go func() { done <- consumer.Run(runCtx) }()

	// The handler's row is visible once the inbox's transaction committed.
	var n int
	for deadline := time.Now().Add(60 * time.Second); n == 0; {
		if err := pool.QueryRow(ctx, countShipments, orderID.String()).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the event was not consumed within 60s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	fmt.Fprintf(stdout, "relayed to %s and consumed through the inbox: %d shipment for order %s\n", topic, n, orderID)

	// Shutdown order: consumers, then the relay; Run returns once drained.
	stop()
	return errors.Join(<-done, <-done)
}

// createTopics creates topics that do not exist yet, through the controller.
func createTopics(ctx context.Context, brokers []string, topics ...string) error {
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return fmt.Errorf("dialing Kafka (is it up? `make up`): %w", err)
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		return err
	}
	cc, err := kafka.DialContext(ctx, "tcp", fmt.Sprintf("%s:%d", ctrl.Host, ctrl.Port))
	if err != nil {
		return err
	}
	defer cc.Close()
	// As many copies as the cluster allows, up to 3, and a write acknowledged
	// only once 2 of them have it (min.insync.replicas): a broker can then
	// die without losing what the relay was told is published. One broker
	// (the dev stack's default) can hold one copy, and 1 and 1 is all it gets.
	bs, err := cc.Brokers()
	if err != nil {
		return err
	}
	rf := min(3, len(bs))
	minISR := kafka.ConfigEntry{ConfigName: "min.insync.replicas", ConfigValue: strconv.Itoa(min(2, rf))}
	for _, t := range topics {
		err := cc.CreateTopics(kafka.TopicConfig{Topic: t, NumPartitions: 3, ReplicationFactor: rf, ConfigEntries: []kafka.ConfigEntry{minISR}})
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("creating topic %s: %w", t, err)
		}
	}
	return nil
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
