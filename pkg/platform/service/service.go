// Package service is the chassis every onceflow service's run builds on: a
// JSON logger, tracing (package tracing), a migrated Postgres pool, a metrics
// registry and an echo server with /healthz, /readyz (Postgres reachable,
// and Kafka unless Options.ReadyWithoutKafka) and /metrics.
// Run then serves HTTP beside the service's workers and stops them in order.
package service

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/onceflow/onceflow/pkg/platform/httpserver"
	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
	"github.com/onceflow/onceflow/pkg/platform/lifecycle"
	"github.com/onceflow/onceflow/pkg/platform/logging"
	"github.com/onceflow/onceflow/pkg/platform/pgutil"
	"github.com/onceflow/onceflow/pkg/platform/tracing"
)

// Options are the settings every service has; each service reads them from
// its own Config so that each documents its own defaults.
type Options struct {
	Name          string
	HTTPAddr      string
	DatabaseURL   string
	KafkaBrokers  []string
	LogLevel      string
	ShutdownGrace time.Duration
	// Tracing configures the tracer provider; Name is its default service name.
	Tracing tracing.Config
	// Migrations are applied in order at start-up: the service's own schema
	// first, then the outbox's and the inbox's as the service uses them.
	Migrations []pgutil.Migration
	// ReadyWithoutKafka leaves Kafka out of /readyz, for a service whose API
	// needs only its database: orders takes orders through a Kafka outage
	// (the outbox exists for that), and a load balancer must not take it
	// out of rotation then. Its relay reports Kafka in metrics and alerts.
	ReadyWithoutKafka bool
}

// Service holds what New set up. Close it when Run has returned.
type Service struct {
	Logger   *slog.Logger
	Pool     *pgxpool.Pool
	Registry *prometheus.Registry
	HTTP     *echo.Echo
	opts     Options
	flush    tracing.Shutdown // flushes and stops the tracer provider
}

// New connects, migrates and builds the HTTP server; the caller adds routes
// to HTTP and builds its workers on Pool and Registry.
func New(ctx context.Context, stdout io.Writer, opts Options) (*Service, error) {
	logger, err := logging.New(stdout, opts.Name, opts.LogLevel)
	if err != nil {
		return nil, err
	}
	shutdownTracing, err := tracing.Setup(ctx, opts.Tracing, opts.Name, logger)
	if err != nil {
		return nil, err
	}
	pool, err := pgutil.Connect(ctx, opts.DatabaseURL, 0)
	if err != nil {
		_ = shutdownTracing(ctx)
		return nil, err
	}
	if err := pgutil.Migrate(pool, opts.Migrations...); err != nil {
		pool.Close()
		_ = shutdownTracing(ctx)
		return nil, err
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	checks := map[string]httpserver.Check{
		"postgres": pool.Ping,
		"kafka":    func(ctx context.Context) error { return kafkautil.Ping(ctx, opts.KafkaBrokers) },
	}
	if opts.ReadyWithoutKafka {
		delete(checks, "kafka")
	}
	e := httpserver.New(httpserver.Config{
		Logger:   logger,
		Gatherer: registry,
		Checks:   checks,
	})
	return &Service{Logger: logger, Pool: pool, Registry: registry, HTTP: e, opts: opts, flush: shutdownTracing}, nil
}

// Run serves HTTP and runs the workers until ctx ends or one fails, then
// stops HTTP first and the workers in the order given (consumers before
// relays, so what a consumer commits last still gets published).
func (s *Service) Run(ctx context.Context, workers ...lifecycle.Stage) error {
	ln, err := net.Listen("tcp", s.opts.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.opts.HTTPAddr, err)
	}
	s.Logger.InfoContext(ctx, s.opts.Name+" started", slog.String("http_addr", ln.Addr().String()))
	stages := append([]lifecycle.Stage{{Name: "http", Run: func(ctx context.Context) error {
		return httpserver.Serve(ctx, s.HTTP, ln, s.opts.ShutdownGrace)
	}}}, workers...)
	err = lifecycle.Run(ctx, stages...)
	if err != nil {
		s.Logger.Error(s.opts.Name+" stopped", slog.Any("error", err))
	} else {
		s.Logger.Info(s.opts.Name + " stopped")
	}
	return err
}

// Close releases the pool and flushes the spans not exported yet, waiting
// at most ShutdownGrace for the collector.
func (s *Service) Close() {
	s.Pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), max(s.opts.ShutdownGrace, time.Second))
	defer cancel()
	if err := s.flush(ctx); err != nil {
		s.Logger.Warn("flushing traces failed; the last spans are lost", slog.Any("error", err))
	}
}
