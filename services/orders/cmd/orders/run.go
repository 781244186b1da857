package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/platform/config"
	"github.com/onceflow/onceflow/pkg/platform/httpserver"
	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
	"github.com/onceflow/onceflow/pkg/platform/lifecycle"
	"github.com/onceflow/onceflow/pkg/platform/logging"
	"github.com/onceflow/onceflow/pkg/platform/pgutil"
	"github.com/onceflow/onceflow/services/orders"
)

// Config is the orders service's configuration, read from the environment.
type Config struct {
	// HTTPAddr is where the API, /healthz, /readyz and /metrics listen.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:"127.0.0.1:8081"`
	// DatabaseURL is the service's own Postgres database.
	DatabaseURL string `env:"DATABASE_URL" envDefault:"postgres://postgres:postgres@127.0.0.1:55432/orders?sslmode=disable"`
	// KafkaBrokers is a comma-separated list of bootstrap brokers.
	KafkaBrokers []string `env:"KAFKA_BROKERS" envDefault:"127.0.0.1:59092"`
	// OrdersTopic receives every order event.
	OrdersTopic string `env:"ORDERS_TOPIC" envDefault:"orders.events"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// ShutdownGrace is how long in-flight requests get to finish on SIGTERM.
	ShutdownGrace time.Duration `env:"SHUTDOWN_GRACE" envDefault:"10s"`
}

func run(ctx context.Context, _ []string, getenv func(string) string, stdout io.Writer) error {
	var cfg Config
	if err := config.Load(getenv, &cfg); err != nil {
		return err
	}
	logger, err := logging.New(stdout, "orders", cfg.LogLevel)
	if err != nil {
		return err
	}

	pool, err := pgutil.Connect(ctx, cfg.DatabaseURL, 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pgutil.Migrate(pool,
		pgutil.Migration{FS: orders.Migrations, Table: orders.MigrationsTable},
		pgutil.Migration{FS: outbox.Migrations, Table: outbox.MigrationsTable},
	); err != nil {
		return err
	}

	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	writer := kafkautil.NewWriter(cfg.KafkaBrokers, 500)
	defer writer.Close()
	relay, err := outbox.NewRelay(pool, writer, outbox.RelayConfig{
		Topic:      func(string) string { return cfg.OrdersTopic },
		Logger:     logger,
		Registerer: registry,
	})
	if err != nil {
		return err
	}

	e := httpserver.New(httpserver.Config{
		Logger:   logger,
		Gatherer: registry,
		Checks: map[string]httpserver.Check{
			"postgres": pool.Ping,
			"kafka":    func(ctx context.Context) error { return kafkautil.Ping(ctx, cfg.KafkaBrokers) },
		},
	})
	orders.Routes(e, orders.NewService(pool, nil))

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.HTTPAddr, err)
	}
	logger.InfoContext(ctx, "orders service started", slog.String("http_addr", ln.Addr().String()),
		slog.String("topic", cfg.OrdersTopic))
	err = lifecycle.Run(ctx,
		lifecycle.Stage{Name: "http", Run: func(ctx context.Context) error {
			return httpserver.Serve(ctx, e, ln, cfg.ShutdownGrace)
		}},
		lifecycle.Stage{Name: "outbox relay", Run: relay.Run},
	)
	logger.Info("orders service stopped", slog.Any("error", err))
	return err
}
