package cdc_test

import (
	"context"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/kafkasafe"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
)

// A service reads its relay mode from its configuration and runs whatever
// relay NewPublisher gives it; business code writes with the mode's
// WriteFunc (Emit in wal mode, Enqueue otherwise), so neither repeats the
// switch. Slot and ReplicationURL matter only in the log-based modes.
func ExampleNewPublisher() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return
	}
	defer pool.Close()
	// The writer the relay needs (acks=all, a short batch timeout, murmur2
	// keys); NewPublisher refuses a bare &kafka.Writer{}.
	w := kafkasafe.NewWriter([]string{"127.0.0.1:9092"}, kafkasafe.WriterConfig{})
	defer w.Close()

	mode, err := outbox.ParseRelayMode(os.Getenv("RELAY_MODE")) // poll, cdc or wal
	if err != nil {
		return
	}
	relay, err := cdc.NewPublisher(pool, w, cdc.PublisherConfig{
		Mode:    mode,
		Topic:   func(string) string { return "orders.events" },
		Logger:  slog.Default(),
		Metrics: outbox.NewMetrics(prometheus.DefaultRegisterer),
		CDC:     cdc.Config{Slot: "orders_outbox", ReplicationURL: os.Getenv("REPLICATION_DATABASE_URL")},
	})
	if err != nil {
		return
	}
	// Business transactions call cdc.Write(mode) for each event.
	_ = relay.Run(ctx) // until ctx ends; outages are waited out
}
