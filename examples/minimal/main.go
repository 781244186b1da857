// Command minimal is the smallest real use of onceflow's libraries, wired
// as the platform's services wire them, the program to start from: it
// writes an order and its OrderPlaced event in one transaction
// (pkg/outbox), relays the event to Kafka on a pool of the relay's own, and
// consumes it through an inbox (pkg/inbox) that records it exactly once;
// both libraries' pruners run beside them, and `minimal requeue` sends the
// consumer's dead letters back (the operator's action).
//
//	go run ./examples/minimal           # against the dev stack (`make up`)
//	go run ./examples/minimal requeue   # requeue every pending dead letter
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
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/kafkasafe"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/pgmigrate"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "minimal:", err)
		os.Exit(1)
	}
}

// consumerName is the inbox's dedupe namespace (inbox.Config.Name): keep it
// when the consumer group changes.
const consumerName = "minimal"

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	dbURL := or(getenv("DATABASE_URL"), "postgres://postgres:postgres@127.0.0.1:7432/postgres?sslmode=disable")
	brokers := strings.Split(or(getenv("KAFKA_BROKERS"), "127.0.0.1:7092"), ",")
	topic := or(getenv("TOPIC"), "minimal.orders")
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The schema first, as its owner: the libraries' tables and the
	// service's own, each tracked in a table of its own.
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := pgmigrate.Up(ctx, pool, Migrations, MigrationsTable); err != nil {
		return err
	}
	// The topic and its dead-letter topic beside it, replicated as the
	// cluster allows (3 copies and min.insync.replicas 2 from three brokers
	// on; 1 and 1 on the dev stack's one).
	admin := &kafka.Client{Addr: kafka.TCP(brokers...)}
	if _, err := kafkasafe.EnsureTopics(ctx, admin, kafkasafe.TopicSpec{Partitions: 3, DeadLetters: true}, topic); err != nil {
		return fmt.Errorf("creating topics (is Kafka up? `make up`): %w", err)
	}
	// acks from every in-sync replica, batches flushed at once, keys hashed
	// as Kafka's Java producer hashes them: the relay refuses a writer
	// without these (a bare &kafka.Writer{} has none of them).
	w := kafkasafe.NewWriter(brokers, kafkasafe.WriterConfig{})
	defer w.Close()

	if len(args) > 0 && args[0] == "requeue" {
		return requeue(ctx, pool, w, brokers, topic, stdout)
	}

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

	// 2. The relay publishes committed events, on a pool of its own: in the
	// pool the requests and the consumer share, each claim would first wait
	// for a connection.
	relayPool, err := ownPool(ctx, dbURL, 4)
	if err != nil {
		return err
	}
	defer relayPool.Close()
	relay, err := outbox.NewRelay(relayPool, w, outbox.RelayConfig{
		Topic: func(string) string { return topic }, Logger: logger})
	if err != nil {
		return err
	}
	// 3. The inbox consumes them; what it cannot handle goes to topic.dlt.
	consumer, err := inbox.NewConsumer(pool,
		inbox.GroupConfig{Brokers: brokers, Topic: topic, Group: consumerName}, w, handle,
		inbox.Config{Name: consumerName, Logger: logger})
	if err != nil {
		return err
	}
	// 4. Without pruners both tables grow forever: published outbox rows
	// and processed inbox rows go after their retention (7 days each by
	// default; the inbox's must outlast any redelivery).
	outboxPruner, err := outbox.NewPruner(pool, outbox.PrunerConfig{Logger: logger})
	if err != nil {
		return err
	}
	inboxPruner, err := inbox.NewPruner(pool, inbox.PrunerConfig{Logger: logger})
	if err != nil {
		return err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	stages := []func(context.Context) error{relay.Run, consumer.Run, outboxPruner.Run, inboxPruner.Run}
	done := make(chan error, len(stages))
	for _, run := range stages {
		go func() { done <- run(runCtx) }()
	}

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

	// Shutdown order: consumers, then the relay; Run returns once drained,
	// so the relay has marked what the broker acknowledged.
	stop()
	var errs []error
	for range stages {
		errs = append(errs, <-done)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return printStatus(ctx, pool, orderID.String(), stdout)
}

// printStatus reads where the order's event is on both sides, as an
// operator would: its outbox row (pending, published or dead) and its
// inbox row of each consumer (processed, dead_lettered, …).
func printStatus(ctx context.Context, pool *pgxpool.Pool, orderID string, stdout io.Writer) error {
	events, err := outboxadmin.EventsOf(ctx, pool, orderID)
	if err != nil {
		return err
	}
	for _, e := range events {
		fmt.Fprintf(stdout, "outbox: %s %s\n", e.EventType, e.State)
	}
	msgs, err := inboxadmin.MessagesOf(ctx, pool, orderID)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		fmt.Fprintf(stdout, "inbox %s: %s %s\n", m.Consumer, m.EventType, m.Status)
	}
	return nil
}

// requeue sends every pending dead letter of the consumer back to topic,
// once its cause is fixed (a handler for a new event type, say), a chunk
// at a time until the pass has read the whole dead-letter topic.
func requeue(ctx context.Context, pool *pgxpool.Pool, w inboxadmin.Writer, brokers []string, topic string, stdout io.Writer) error {
	total, next := 0, ""
	for {
		res, err := inboxadmin.RequeueDeadLetters(ctx, pool, w, brokers, topic+kafkasafe.DeadLetterSuffix,
			inboxadmin.RequeueFilter{Consumer: consumerName, After: next})
		if err != nil {
			return fmt.Errorf("requeuing dead letters: %w", err)
		}
		total += res.Requeued
		for _, r := range res.Refused {
			fmt.Fprintf(stdout, "refused: %+v\n", r)
		}
		if next = res.Next; next == "" {
			break
		}
	}
	fmt.Fprintf(stdout, "requeued %d dead letters to %s\n", total, topic)
	return nil
}

// ownPool opens a pool of size connections for one worker.
func ownPool(ctx context.Context, dbURL string, size int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = size
	return pgxpool.NewWithConfig(ctx, cfg)
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
