// Package service is the chassis every onceflow service's run builds on: a
// JSON logger, tracing (package tracing), a migrated Postgres pool, a metrics
// registry and an echo server with /healthz, /readyz (Postgres and Kafka
// reachable) and /metrics.
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

	// MigrateDatabaseURL is the owner role's URL, used only to apply
	// Migrations at start-up (DatabaseURL is the runtime role's). MigrateNone
	// skips migrating, for deployments that run migrations as a separate job.
	// Empty migrates over DatabaseURL when that role may create tables (a
	// single-role setup, as in most tests) and otherwise skips with a
	// warning: a least-privilege runtime role must not try DDL.
	MigrateDatabaseURL string
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
	if err := migrate(ctx, pool, opts, logger); err != nil {
		pool.Close()
		_ = shutdownTracing(ctx)
		return nil, err
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	e := httpserver.New(httpserver.Config{
		Logger:   logger,
		Gatherer: registry,
		Checks: map[string]httpserver.Check{
			"postgres": pool.Ping,
			"kafka":    func(ctx context.Context) error { return kafkautil.Ping(ctx, opts.KafkaBrokers) },
		},
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

// MigrateNone is the MigrateDatabaseURL that skips migrating.
const MigrateNone = "none"

// migrate applies opts.Migrations as MigrateDatabaseURL says, on a pool of
// its own closed before the service starts, so the owner role's
// connections do not outlive start-up.
func migrate(ctx context.Context, pool *pgxpool.Pool, opts Options, logger *slog.Logger) error {
	switch opts.MigrateDatabaseURL {
	case MigrateNone:
		return nil
	case "":
		var mayCreate bool
		if err := pool.QueryRow(ctx, `SELECT has_schema_privilege('public', 'CREATE')`).Scan(&mayCreate); err != nil {
			return fmt.Errorf("checking whether the runtime role may migrate: %w", err)
		}
		if !mayCreate {
			logger.WarnContext(ctx, "not migrating: the DATABASE_URL role cannot create tables and MIGRATE_DATABASE_URL is empty; "+
				"the schema must be migrated by its owner (set MIGRATE_DATABASE_URL, or \"none\" to silence this)")
			return nil
		}
		return pgutil.Migrate(pool, opts.Migrations...)
	}
	owner, err := pgutil.Connect(ctx, opts.MigrateDatabaseURL, 2)
	if err != nil {
		return fmt.Errorf("connecting to migrate: %w", err)
	}
	defer owner.Close()
	return pgutil.Migrate(owner, opts.Migrations...)
}
