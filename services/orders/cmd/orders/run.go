package main

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxhttp"
	"github.com/onceflow/onceflow/pkg/platform/config"
	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
	"github.com/onceflow/onceflow/pkg/platform/lifecycle"
	"github.com/onceflow/onceflow/pkg/platform/pgutil"
	"github.com/onceflow/onceflow/pkg/platform/service"
	"github.com/onceflow/onceflow/pkg/platform/tracing"
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
	// OutboxRetention is how long published outbox rows are kept before the
	// pruner removes them.
	OutboxRetention time.Duration `env:"OUTBOX_RETENTION" envDefault:"168h"`
	// OutboxArchive moves pruned rows to outbox_events_archive instead of
	// deleting them (for audit trails that outlive the retention window).
	OutboxArchive bool `env:"OUTBOX_ARCHIVE" envDefault:"false"`
	// RelayEnabled runs the outbox relay in this process. false keeps taking
	// orders but publishes nothing (the backlog gauges are still reported, so
	// the backlog alerts fire): for a relay run by another deployment, or for
	// an alerting drill.
	RelayEnabled bool `env:"RELAY_ENABLED" envDefault:"true"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// ShutdownGrace is how long in-flight requests get to finish on SIGTERM.
	ShutdownGrace time.Duration `env:"SHUTDOWN_GRACE" envDefault:"10s"`
	// Tracing is OTEL_TRACES_EXPORTER and the other OpenTelemetry variables
	// (see package tracing).
	Tracing tracing.Config
}

func run(ctx context.Context, _ []string, getenv func(string) string, stdout io.Writer) error {
	var cfg Config
	if err := config.Load(getenv, &cfg); err != nil {
		return err
	}
	svc, err := service.New(ctx, stdout, service.Options{
		Name: "orders", HTTPAddr: cfg.HTTPAddr, DatabaseURL: cfg.DatabaseURL, KafkaBrokers: cfg.KafkaBrokers,
		LogLevel: cfg.LogLevel, ShutdownGrace: cfg.ShutdownGrace, Tracing: cfg.Tracing,
		Migrations: []pgutil.Migration{
			{FS: orders.Migrations, Table: orders.MigrationsTable},
			{FS: outbox.Migrations, Table: outbox.MigrationsTable},
		},
	})
	if err != nil {
		return err
	}
	defer svc.Close()

	metrics := outbox.NewMetrics(svc.Registry)
	relayStage := lifecycle.Stage{Name: "outbox backlog gauges", Run: func(ctx context.Context) error {
		return metrics.WatchBacklog(ctx, svc.Pool, 2*time.Second, svc.Logger)
	}}
	if cfg.RelayEnabled {
		writer := kafkautil.NewWriter(cfg.KafkaBrokers, 500)
		defer writer.Close()
		relay, err := outbox.NewRelay(svc.Pool, writer, outbox.RelayConfig{
			Topic:   func(string) string { return cfg.OrdersTopic },
			Logger:  svc.Logger,
			Metrics: metrics,
		})
		if err != nil {
			return err
		}
		relayStage = lifecycle.Stage{Name: "outbox relay", Run: relay.Run}
	} else {
		svc.Logger.WarnContext(ctx, "the outbox relay is disabled (RELAY_ENABLED=false): orders are taken but not published")
	}
	pruner, err := outbox.NewPruner(svc.Pool, outbox.PrunerConfig{
		PruneConfig: outbox.PruneConfig{Retention: cfg.OutboxRetention, Archive: cfg.OutboxArchive},
		Logger:      svc.Logger,
	})
	if err != nil {
		return err
	}
	// Operators list, requeue and replay outbox events here (see outboxhttp).
	svc.HTTP.Any("/admin/outbox/*", echo.WrapHandler(http.StripPrefix("/admin/outbox", outboxhttp.Handler(svc.Pool))))
	orders.Routes(svc.HTTP, orders.NewService(svc.Pool, nil).WithMetrics(orders.NewMetrics(svc.Registry)))
	return svc.Run(ctx,
		relayStage,
		lifecycle.Stage{Name: "outbox pruner", Run: pruner.Run},
	)
}
