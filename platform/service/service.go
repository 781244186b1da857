// Package service is the chassis every onceflow service's run builds on: a
// JSON logger, tracing (package tracing), a migrated Postgres pool, a metrics
// registry, and two echo servers: the public one (HTTP) with the API,
// /healthz and /readyz (Postgres reachable, and Kafka unless
// Options.ReadyWithoutKafka), and the operator one
// (Admin, on ADMIN_ADDR) with /metrics, the /admin/... routes behind the
// bearer token ADMIN_TOKEN, and opt-in pprof; and, opt-in (DEBUG_ADDR), a
// debug listener serving only net/http/pprof (Debug).
// Run then serves them beside the service's workers and stops them in order.
package service

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/lifecycle"
	"github.com/onceflow/onceflow/platform/logging"
	"github.com/onceflow/onceflow/platform/pgutil"
	"github.com/onceflow/onceflow/platform/tracing"
)

// Options are the settings every service has; each service reads them from
// its own Config so that each documents its own defaults.
type Options struct {
	Name     string
	HTTPAddr string
	// AdminAddr is the operator listener's address. New refuses a
	// non-loopback one without HTTP.AdminToken.
	AdminAddr   string
	HTTP        HTTPConfig
	DatabaseURL string
	// PoolConns sizes Pool when DatabaseURL does not (pool_max_conns);
	// zero is pgxpool's default, max(4, cores). A service whose requests
	// each commit needs about as many connections as commits in flight:
	// each waits for its WAL flush, and Postgres flushes the commits that
	// wait together at once (group commit), so more connections cost
	// little, while too few cap the requests at PoolConns per flush time.
	PoolConns    int32
	KafkaBrokers []string
	// Kafka is how /readyz's broker check, and the service's own Kafka
	// clients, connect (TLS, SASL).
	Kafka         kafkautil.Security
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

	// MigrateDatabaseURL is the owner role's URL, used only to apply
	// Migrations at start-up (DatabaseURL is the runtime role's). MigrateNone
	// skips migrating, for deployments that run migrations as a separate job.
	// Empty migrates over DatabaseURL when that role may create tables (a
	// single-role setup, as in most tests) and otherwise skips with a
	// warning: a least-privilege runtime role must not try DDL.
	MigrateDatabaseURL string

	// stdout is New's writer, kept for the listening record Run writes
	// whatever LOG_LEVEL says (logging.Listening).
	stdout io.Writer
}

// HTTPConfig is what every service reads about its two listeners besides
// their addresses; each service's Config embeds it through Env.
type HTTPConfig struct {
	// AdminToken is the bearer token the operator routes (/admin/...,
	// /debug/pprof/...) require. No default: without it those routes answer
	// 401, and a non-loopback ADMIN_ADDR refuses to start.
	AdminToken string `env:"ADMIN_TOKEN"`
	// Pprof serves net/http/pprof on the operator listener, behind the token.
	Pprof bool `env:"PPROF" envDefault:"false"`
	// DebugAddr is the opt-in debug listener (see Debug): net/http/pprof
	// without a token, for `go tool pprof` and `make bench -profile-dir`.
	// Empty, the default, is off. Loopback only, unless AdminToken is set,
	// which it then requires.
	DebugAddr string `env:"DEBUG_ADDR"`
	// Timeouts bound every request on both listeners (HTTP_READ_TIMEOUT and
	// the others; see httpserver.Timeouts).
	Timeouts httpserver.Timeouts
}

// Service holds what New set up. Close it when Run has returned.
type Service struct {
	Logger   *slog.Logger
	Pool     *pgxpool.Pool
	Registry *prometheus.Registry
	HTTP     *echo.Echo
	// Admin is the operator listener: mount operator routes with Mount.
	Admin  *echo.Echo
	opts   Options
	pools  []*pgxpool.Pool             // OwnPool's, closed by Close
	debug  *Debug                      // nil when DEBUG_ADDR is empty
	checks map[string]httpserver.Check // /readyz's, by name
	flush  tracing.Shutdown            // flushes and stops the tracer provider
}

// New connects, migrates and builds the HTTP server; the caller adds routes
// to HTTP and builds its workers on Pool and Registry.
func New(ctx context.Context, stdout io.Writer, opts Options) (*Service, error) {
	if err := httpserver.CheckAdminAddr(opts.AdminAddr, opts.HTTP.AdminToken); err != nil {
		return nil, err
	}
	opts.stdout = stdout
	logger, err := logging.New(stdout, opts.Name, opts.LogLevel)
	if err != nil {
		return nil, err
	}
	// Listening here, before anything connects, makes a bad DEBUG_ADDR fail
	// the start at once.
	debug, err := ListenDebug(opts.HTTP.DebugAddr, opts.HTTP.AdminToken)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			_ = debug.Close()
		}
	}()
	shutdownTracing, err := tracing.Setup(ctx, opts.Tracing, opts.Name, logger)
	if err != nil {
		return nil, err
	}
	poolConns := opts.PoolConns
	if strings.Contains(opts.DatabaseURL, "pool_max_conns") {
		poolConns = 0 // the URL's
	}
	// Which server the pool reaches: after a failover, the promoted standby.
	watch := pgutil.NewServerWatch(logger)
	pool, err := pgutil.ConnectWatched(ctx, opts.DatabaseURL, poolConns, watch)
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
	registry.MustRegister(watch.Collectors()...)
	checks := map[string]httpserver.Check{
		"postgres": pool.Ping,
		"kafka":    func(ctx context.Context) error { return kafkautil.PingWith(ctx, opts.Kafka, opts.KafkaBrokers) },
	}
	if opts.ReadyWithoutKafka {
		delete(checks, "kafka")
	}
	e := httpserver.New(httpserver.Config{
		Logger:     logger,
		Registerer: registry,
		Checks:     checks,
	})
	admin := httpserver.NewAdmin(httpserver.AdminConfig{
		Logger: logger, Gatherer: registry, Token: opts.HTTP.AdminToken, Pprof: opts.HTTP.Pprof,
	})
	started = true
	return &Service{Logger: logger, Pool: pool, Registry: registry, HTTP: e, Admin: admin, opts: opts, flush: shutdownTracing,
		checks: checks, debug: debug}, nil
}

// RelayPoolConns sizes the outbox relay's own pool (OwnPool): the claim
// loop's connection, the LISTEN connection (taken out of the pool, so the
// pool may open another), the backlog gauges' and, for the log-based relay,
// its occasional queries beside the stream.
const RelayPoolConns = 4

// OwnPool opens a pool of at most maxConns connections on the service's
// database, for a worker that must not queue behind the API's requests and
// the other workers for a connection. The outbox relay is the one that
// needs it: it holds a connection through each batch, and in the shared
// pool under load every claim would first wait for one of the connections
// the requests hold, and every event with it (BENCHMARKS.md, issue 23).
// Close closes it.
func (s *Service) OwnPool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	pool, err := pgutil.Connect(ctx, s.opts.DatabaseURL, maxConns)
	if err != nil {
		return nil, err
	}
	s.pools = append(s.pools, pool)
	return pool, nil
}

// AddCheck adds a readiness check to /readyz, for a worker that can say
// which of its dependencies is broken (inbox.Consumer.Healthy). Call it
// before Run.
func (s *Service) AddCheck(name string, check httpserver.Check) {
	s.checks[name] = check
}

// Mount serves h under prefix (such as "/admin/outbox") on the operator
// listener, with the prefix stripped, behind the bearer token.
func (s *Service) Mount(prefix string, h http.Handler) {
	s.Admin.Any(prefix+"/*", echo.WrapHandler(http.StripPrefix(prefix, h)))
}

// Run serves both listeners and runs the workers until ctx ends or one
// fails, then stops the public HTTP first, the workers in the order given
// (consumers before relays, so what a consumer commits last still gets
// published), and the operator listener last.
func (s *Service) Run(ctx context.Context, workers ...lifecycle.Stage) error {
	ln, err := net.Listen("tcp", s.opts.HTTPAddr)
	if err != nil {
		_ = s.debug.Close()
		return fmt.Errorf("listening on %s: %w", s.opts.HTTPAddr, err)
	}
	adminLn, err := net.Listen("tcp", s.opts.AdminAddr)
	if err != nil {
		ln.Close()
		_ = s.debug.Close()
		return fmt.Errorf("listening on ADMIN_ADDR %s: %w", s.opts.AdminAddr, err)
	}
	logging.Listening(ctx, s.opts.stdout, s.opts.Name, ln.Addr().String(), adminLn.Addr().String())
	s.Logger.InfoContext(ctx, s.opts.Name+" started",
		slog.String("http_addr", ln.Addr().String()), slog.String("admin_addr", adminLn.Addr().String()),
		slog.Bool("admin_token_set", s.opts.HTTP.AdminToken != ""), slog.Bool("pprof", s.opts.HTTP.Pprof),
		slog.String("debug_addr", s.debug.Addr()))
	timeouts := s.opts.HTTP.Timeouts
	// The operator listener stops last, so /metrics shows the workers
	// draining until they are done; the debug listener with it, so a profile
	// can cover the shutdown.
	stages := append(append([]lifecycle.Stage{{Name: "http", Run: func(ctx context.Context) error {
		return httpserver.Serve(ctx, s.HTTP, ln, s.opts.ShutdownGrace, timeouts)
	}}}, workers...), lifecycle.Stage{Name: "admin http", Run: func(ctx context.Context) error {
		return httpserver.Serve(ctx, s.Admin, adminLn, s.opts.ShutdownGrace, timeouts)
	}})
	stages = append(stages, s.debug.Stages(s.opts.ShutdownGrace)...)
	bctx, stopBrokerCheck := context.WithCancel(ctx)
	defer stopBrokerCheck()
	go watchBrokerList(bctx, s.Logger, s.opts.Kafka, s.opts.KafkaBrokers)
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
	for _, p := range s.pools {
		p.Close()
	}
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
