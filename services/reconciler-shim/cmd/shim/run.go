package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/onceflow/onceflow/pkg/crashpoint"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/platform/config"
	"github.com/onceflow/onceflow/platform/crash"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/lifecycle"
	"github.com/onceflow/onceflow/platform/service"
	shim "github.com/onceflow/onceflow/services/reconciler-shim"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// Config is the shim's configuration, read from the environment.
type Config struct {
	// Env is what every service reads the same way: ADMIN_TOKEN and the
	// other HTTP settings, MIGRATE_DATABASE_URL, KAFKA_BROKERS and Kafka's
	// security, LOG_LEVEL, SHUTDOWN_GRACE, tracing and CRASH_AFTER.
	service.Env
	// HTTPAddr is where /healthz and /readyz listen.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:"127.0.0.1:8083"`
	// AdminAddr is the operator listener: /metrics, /admin/inbox/... and, with
	// PPROF=true, /debug/pprof/. Loopback by default; any other address
	// needs ADMIN_TOKEN.
	AdminAddr string `env:"ADMIN_ADDR" envDefault:"127.0.0.1:9083"`
	// DatabaseURL is the shim's own Postgres database, as its runtime role
	// (shim_app: reads and writes the tables, no DDL; see package pgroles).
	DatabaseURL string `env:"DATABASE_URL" envDefault:"postgres://shim_app:shim_app@127.0.0.1:7432/shim?sslmode=disable"`
	// BillingTopic is consumed; its dead letters go to BillingTopic + ".dlt".
	BillingTopic string `env:"BILLING_TOPIC" envDefault:"billing.events"`
	// ConsumerGroup is the Kafka consumer group.
	ConsumerGroup string `env:"CONSUMER_GROUP" envDefault:"reconciler-shim"`
	// InboxName is the inbox's consumer name, its dedupe namespace; empty
	// is ConsumerGroup. Keep it when a fresh consumer group re-reads the
	// topic (the replay runbook), so that what the old group forwarded is a
	// duplicate, never a second booking.
	InboxName string `env:"INBOX_NAME"`
	// InboxCommitReplicated makes the consumer commit its Kafka offsets only
	// for work every standby streaming through a physical slot has flushed
	// (inbox.Config.CommitReplicated): after a failover to an asynchronous
	// standby, the messages whose effects died with the old primary are
	// delivered again instead of skipped. A standby down or behind holds
	// the offsets back, reported as inbox_standby_connected 0. See
	// docs/operations.md.
	InboxCommitReplicated bool `env:"INBOX_COMMIT_REPLICATED" envDefault:"false"`
	// ReconcilerURL is the third-party reconciler's base URL.
	ReconcilerURL string `env:"RECONCILER_URL" envDefault:"http://127.0.0.1:8084"`
	// ReconcilerTimeout bounds each call to the reconciler; a timed-out call
	// is retried, and the retry first asks whether the call landed.
	ReconcilerTimeout time.Duration `env:"RECONCILER_TIMEOUT" envDefault:"5s"`
	// ReconcilerMaxInFlight bounds the calls to the reconciler in flight at
	// once (lease.Config.MaxInFlight): payments of distinct orders are
	// forwarded concurrently up to it, each order's in order. It also sizes
	// the client's pool of kept-alive connections, so concurrent calls do
	// not open and close a connection each.
	ReconcilerMaxInFlight int `env:"RECONCILER_MAX_IN_FLIGHT" envDefault:"16"`
	// CrashPoint arms a crash point for fault injection (inbox.after-effect:
	// after the reconciler booked a payment, before the shim marks it done):
	// the process SIGKILLs itself the CrashAfter-th time it gets there.
	// "none" arms nothing.
	CrashPoint string `env:"CRASH_POINT" envDefault:"none"`
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	var cfg Config
	if err := config.Read(args, getenv, stdout,
		"The reconciler shim: consumes payment events through its inbox and forwards each, once, to the third-party reconciler.", &cfg); err != nil {
		return err
	}
	svcOpts, err := cfg.Options("reconciler-shim", cfg.HTTPAddr, cfg.AdminAddr, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	kafkaSecurity := svcOpts.Kafka
	svcOpts.Migrations = shim.Schema
	svc, err := service.New(ctx, stdout, svcOpts)
	if err != nil {
		return err
	}
	defer svc.Close()
	crashPoint, err := crash.Point(cfg.CrashPoint, cfg.CrashAfter, svc.Logger, crashpoint.InboxAfterEffect)
	if err != nil {
		return err
	}
	ctx = crash.Arm(ctx, crashPoint)

	if cfg.ReconcilerMaxInFlight < 1 {
		return fmt.Errorf("RECONCILER_MAX_IN_FLIGHT must be at least 1, got %d", cfg.ReconcilerMaxInFlight)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = cfg.ReconcilerMaxInFlight
	tp := thirdparty.NewClient(cfg.ReconcilerURL, &http.Client{Timeout: cfg.ReconcilerTimeout, Transport: transport})
	dlq := kafkautil.NewWriter(cfg.KafkaBrokers, 10, kafkautil.WithSecurity(kafkaSecurity))
	defer dlq.Close()
	src := inbox.GroupConfig{Brokers: cfg.KafkaBrokers, Topic: cfg.BillingTopic, Group: cfg.ConsumerGroup,
		Dialer: kafkaSecurity.Dialer()}
	consumer, err := lease.NewConsumer(svc.Pool, src, dlq, shim.New(tp, svc.Logger).WithMetrics(shim.NewMetrics(svc.Registry)).Effect(), lease.Config{
		Config: inbox.Config{
			Name:             cmp.Or(cfg.InboxName, cfg.ConsumerGroup),
			CommitReplicated: cfg.InboxCommitReplicated,
			ShutdownGrace:    cfg.ShutdownGrace,
			Logger:           svc.Logger,
			Metrics:          inbox.NewMetrics(svc.Registry),
		},
		// Each call to the reconciler starts right after its lease was
		// renewed and ends within ReconcilerTimeout; the lease outlives it by
		// twice that, which leaves the default LeaseMargin (LeaseTTL/10) for
		// a call to land after the shim stopped waiting for it.
		LeaseTTL:    3 * cfg.ReconcilerTimeout,
		CallTimeout: cfg.ReconcilerTimeout,
		MaxInFlight: cfg.ReconcilerMaxInFlight,
	})
	if err != nil {
		return err
	}
	svc.AddCheck("billing_consumer", func(context.Context) error { return consumer.Healthy() })
	inboxPruner, err := svc.InboxOperations(dlq, cfg.BillingTopic)
	if err != nil {
		return err
	}
	return svc.Run(ctx,
		lifecycle.Stage{Name: "billing consumer", Run: consumer.Run},
		inboxPruner,
	)
}
