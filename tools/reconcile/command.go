package reconcile

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onceflow/onceflow/platform/httpserver"
)

// ErrFindings is what Command returns, after printing the report, when a
// one-shot run found something: `make reconcile` and scripts then exit
// non-zero. -exit-zero turns it off; -serve never returns it (the gauges and
// the alerts carry the findings there).
var ErrFindings = errors.New("the reconciliation found inconsistencies (see the report above)")

// The dev stack's sources, read as reconcile_ro (see tools/cmd/pgroles).
const (
	defaultOrdersURL  = "postgres://reconcile_ro:reconcile_ro@127.0.0.1:7432/orders?sslmode=disable"
	defaultBillingURL = "postgres://reconcile_ro:reconcile_ro@127.0.0.1:7432/billing?sslmode=disable"
	defaultShimURL    = "postgres://reconcile_ro:reconcile_ro@127.0.0.1:7432/shim?sslmode=disable"
	defaultLedgerURL  = "http://127.0.0.1:8084"
)

// Command is the reconcile command line, shared by tools/cmd/reconcile and
// `onceflowctl reconcile`. It prints one report (-o text or json), or with
// -serve keeps running, reconciling every -interval and serving the gauges
// on -serve's /metrics for Prometheus.
//
// Sources come from the environment: ONCEFLOW_RECONCILE_ORDERS_URL,
// ONCEFLOW_RECONCILE_BILLING_URL, ONCEFLOW_RECONCILE_SHIM_URL (default the
// dev stack's databases as reconcile_ro) and ONCEFLOW_LEDGER_URL (default
// http://127.0.0.1:8084; "none" skips the ledger).
func Command(ctx context.Context, name string, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	def := Config{}.WithDefaults()
	var cfg Config
	output := fs.String("o", "text", "output: text (a table and the runbook lines) or json")
	serve := fs.String("serve", "", "keep running and serve the gauges on this address's /metrics (e.g. 127.0.0.1:9085)")
	interval := fs.Duration("interval", time.Minute, "with -serve: how often to reconcile")
	fs.DurationVar(&cfg.OutboxStuckAfter, "outbox-stuck-after", def.OutboxStuckAfter, "a pending outbox row older than this is stuck")
	fs.DurationVar(&cfg.LeaseGrace, "lease-grace", def.LeaseGrace, "a leased inbox row this long past its lease is stuck")
	fs.DurationVar(&cfg.DeadLetterSLA, "dead-letter-sla", def.DeadLetterSLA, "an inbox dead letter older than this is overdue")
	fs.DurationVar(&cfg.ChargeAfter, "charge-after", def.ChargeAfter, "an order older than this must have a charge")
	fs.DurationVar(&cfg.SettleAfter, "settle-after", def.SettleAfter, "a charge older than this must be forwarded and booked")
	fs.DurationVar(&cfg.Lookback, "lookback", def.Lookback, "orders and charges older than this are not cross-checked")
	fs.IntVar(&cfg.Samples, "samples", def.Samples, "ids listed per finding")
	exitZero := fs.Bool("exit-zero", false, "exit 0 even when the report has findings (default: exit 1, so scripts and make notice)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *output != "text" && *output != "json" {
		return fmt.Errorf("-o must be text or json, got %q", *output)
	}
	env := func(key, def string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return def
	}
	var src Sources
	for _, db := range []struct {
		into *Querier
		key  string
		def  string
	}{
		{&src.Orders, "ONCEFLOW_RECONCILE_ORDERS_URL", defaultOrdersURL},
		{&src.Billing, "ONCEFLOW_RECONCILE_BILLING_URL", defaultBillingURL},
		{&src.Shim, "ONCEFLOW_RECONCILE_SHIM_URL", defaultShimURL},
	} {
		pool, err := pgxpool.New(ctx, env(db.key, db.def))
		if err != nil {
			return fmt.Errorf("%s: %w", db.key, err)
		}
		defer pool.Close()
		*db.into = pool
	}
	if src.LedgerURL = env("ONCEFLOW_LEDGER_URL", defaultLedgerURL); src.LedgerURL == "none" {
		src.LedgerURL = ""
	}
	if *serve == "" {
		rep, err := Run(ctx, src, cfg)
		if err != nil {
			return err
		}
		write := rep.WriteText
		if *output == "json" {
			write = rep.WriteJSON
		}
		if err := write(stdout); err != nil {
			return err
		}
		if n := len(rep.Problems()); n > 0 && !*exitZero {
			return fmt.Errorf("%w: %d kind(s)", ErrFindings, n)
		}
		return nil
	}
	return Serve(ctx, *serve, *interval, src, cfg, slog.New(slog.NewJSONHandler(stdout, nil)))
}

// Serve reconciles every interval and serves the gauges (Metrics) on addr's
// /metrics, and /healthz and /readyz, until ctx ends. A failed run is logged and counted; the next one
// tries again.
func Serve(ctx context.Context, addr string, interval time.Duration, src Sources, cfg Config, logger *slog.Logger) error {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Ready as soon as it serves: a failing source shows in the gauges and
	// the ReconciliationStale alert, not as a job that never starts.
	// The body is the platform's one readiness shape (httpserver.Ready).
	mux.HandleFunc("/healthz", httpserver.Healthz)
	mux.HandleFunc("/readyz", httpserver.Ready(map[string]httpserver.Check{
		"reconcile": func(context.Context) error { return nil },
	}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.InfoContext(ctx, "reconcile serving", slog.String("addr", ln.Addr().String()), slog.Duration("interval", interval))

	once := func() {
		runCtx, cancel := context.WithTimeout(ctx, max(interval, 30*time.Second))
		defer cancel()
		rep, err := Run(runCtx, src, cfg)
		if err != nil {
			m.Failed()
			logger.ErrorContext(ctx, "reconciliation failed", slog.Any("error", err))
			return
		}
		m.Observe(rep)
		for _, f := range rep.Problems() {
			logger.WarnContext(ctx, "reconciliation finding", slog.String("kind", f.Kind), slog.String("component", f.Component),
				slog.Int("count", f.Count), slog.Duration("oldest_age", f.OldestAge), slog.Any("samples", f.Samples))
		}
	}
	once()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			once()
		case err := <-served:
			return fmt.Errorf("serving metrics: %w", err)
		case <-ctx.Done():
			shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("stopping the metrics server: %w", err)
			}
			return nil
		}
	}
}
