package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/onceflow/onceflow/platform/config"
	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/lifecycle"
	"github.com/onceflow/onceflow/platform/logging"
	"github.com/onceflow/onceflow/platform/service"
	"github.com/onceflow/onceflow/platform/tracing"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// shutdownGrace bounds how long in-flight requests may finish after SIGTERM;
// longer than the usual injected hang is not needed, because a hung request
// returns as soon as its caller gives up.
const shutdownGrace = 10 * time.Second

// runConfig is everything the stand-in reads from the environment.
type runConfig struct {
	// HTTPAddr is where the API listens. Port 0 picks a free port; the
	// address actually bound is logged at start.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:"127.0.0.1:8084"`
	// AdminAddr is the operator listener: /metrics, /admin/faults (fault
	// injection, behind ADMIN_TOKEN) and, with PPROF=true, /debug/pprof/.
	// Loopback by default; any other address needs ADMIN_TOKEN. Port 0
	// picks a free port, logged at start as admin_addr.
	AdminAddr string `env:"ADMIN_ADDR" envDefault:"127.0.0.1:9084"`
	// HTTP is ADMIN_TOKEN, PPROF, DEBUG_ADDR and the HTTP_* server timeouts
	// (see service.HTTPConfig).
	HTTP service.HTTPConfig
	// LedgerPath is the JSON Lines file every settlement is appended to. It
	// is reloaded at start, so an audit counts bookings across restarts;
	// delete it to start a run from zero.
	LedgerPath string `env:"LEDGER_PATH" envDefault:"reconciler-ledger.jsonl"`
	// LogLevel is debug, info, warn or error; debug adds one line per request.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// Tracing is OTEL_TRACES_EXPORTER and the other OpenTelemetry variables
	// (see package tracing): each booking's request is a server span that
	// continues the shim's trace.
	Tracing tracing.Config
}

// run serves the stand-in until ctx ends. It is main without the process:
// tests call it with their own arguments, environment and output.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() { usage(stdout, args[0]) }
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q; configuration comes from the environment (see -h)", fs.Args())
	}

	var cfg runConfig
	if err := config.Load(getenv, &cfg); err != nil {
		return err
	}
	if err := httpserver.CheckAdminAddr(cfg.AdminAddr, cfg.HTTP.AdminToken); err != nil {
		return err
	}
	logger, err := logging.New(stdout, "reconciler", cfg.LogLevel)
	if err != nil {
		return err
	}

	shutdownTracing, err := tracing.Setup(ctx, cfg.Tracing, "reconciler", logger)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := shutdownTracing(ctx); err != nil {
			logger.WarnContext(ctx, "flushing traces failed; the last spans are lost", slog.Any("error", err))
		}
	}()

	ledger, err := thirdparty.OpenLedger(cfg.LedgerPath)
	if err != nil {
		return err
	}
	defer func() {
		if err := ledger.Close(); err != nil {
			logger.ErrorContext(ctx, "closing ledger", slog.Any("error", err))
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := thirdparty.NewServer(ledger, logger, reg, thirdparty.AdminOptions{Token: cfg.HTTP.AdminToken, Pprof: cfg.HTTP.Pprof})
	if err != nil {
		return err
	}

	// Listening before logging makes the logged address the real one, which
	// is how tests and the harness find a port-0 server.
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.HTTPAddr, err)
	}
	adminLn, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("listening on ADMIN_ADDR %s: %w", cfg.AdminAddr, err)
	}
	debug, err := service.ListenDebug(cfg.HTTP.DebugAddr, cfg.HTTP.AdminToken)
	if err != nil {
		ln.Close()
		adminLn.Close()
		return err
	}
	stats := ledger.Stats()
	logger.InfoContext(ctx, "reconciler listening",
		slog.String("addr", ln.Addr().String()), slog.String("admin_addr", adminLn.Addr().String()),
		slog.String("debug_addr", debug.Addr()), slog.String("ledger_path", cfg.LedgerPath),
		slog.Int("settlements", stats.Settlements), slog.Int("duplicates", stats.Duplicates))
	logging.Listening(ctx, stdout, "reconciler", ln.Addr().String(), adminLn.Addr().String())

	err = lifecycle.Run(ctx, append([]lifecycle.Stage{
		{Name: "http", Run: func(ctx context.Context) error {
			return httpserver.Serve(ctx, srv.Public, ln, shutdownGrace, cfg.HTTP.Timeouts)
		}},
		{Name: "admin http", Run: func(ctx context.Context) error {
			return httpserver.Serve(ctx, srv.Admin, adminLn, shutdownGrace, cfg.HTTP.Timeouts)
		}},
	}, debug.Stages(shutdownGrace)...)...)
	logger.InfoContext(ctx, "reconciler stopped")
	return err
}

func usage(w io.Writer, name string) {
	fmt.Fprintf(w, "Usage: %s\n\nThe stand-in third-party reconciler. Environment (default):\n", name)
	vars, err := config.Vars(&runConfig{})
	if err != nil {
		fmt.Fprintln(w, err)
		return
	}
	for _, v := range vars {
		fmt.Fprintf(w, "  %s (%s)\n", v.Name, v.Default)
	}
}
