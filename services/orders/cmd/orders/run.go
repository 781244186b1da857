package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/onceflow/onceflow/pkg/crashpoint"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/platform/config"
	"github.com/onceflow/onceflow/platform/crash"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/lifecycle"
	"github.com/onceflow/onceflow/platform/outboxrelay"
	"github.com/onceflow/onceflow/platform/service"
	"github.com/onceflow/onceflow/services/orders"
)

// Config is the orders service's configuration, read from the environment.
type Config struct {
	// Env is what every service reads the same way: ADMIN_TOKEN and the
	// other HTTP settings, MIGRATE_DATABASE_URL, KAFKA_BROKERS and Kafka's
	// security, LOG_LEVEL, SHUTDOWN_GRACE, tracing and CRASH_AFTER.
	service.Env
	// HTTPAddr is where the API, /healthz and /readyz listen.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:"127.0.0.1:8081"`
	// AdminAddr is the operator listener: /metrics, /admin/outbox/... and, with
	// PPROF=true, /debug/pprof/. Loopback by default; any other address
	// needs ADMIN_TOKEN.
	AdminAddr string `env:"ADMIN_ADDR" envDefault:"127.0.0.1:9081"`
	// DatabaseURL is the service's own Postgres database, as its runtime role
	// (orders_app: reads and writes the tables, no DDL; see package pgroles).
	DatabaseURL string `env:"DATABASE_URL" envDefault:"postgres://orders_app:orders_app@127.0.0.1:7432/orders?sslmode=disable"`
	// OrdersTopic receives every order event.
	OrdersTopic string `env:"ORDERS_TOPIC" envDefault:"orders.events"`
	// OutboxRetention is how long published outbox rows are kept before the
	// pruner removes them. In RELAY_MODE=debezium, where Debezium marks no
	// row published, it is how long any row is kept after its insert: the
	// window an operator can replay, and the one from which a lost slot's
	// events can be written again (docs/debezium). Keep it well above
	// Debezium's worst lag.
	OutboxRetention time.Duration `env:"OUTBOX_RETENTION" envDefault:"168h"`
	// OutboxArchive moves pruned rows to outbox_events_archive instead of
	// deleting them (for audit trails that outlive the retention window).
	OutboxArchive bool `env:"OUTBOX_ARCHIVE" envDefault:"false"`
	// RelayEnabled runs the outbox relay in this process. false keeps taking
	// orders but publishes nothing (the backlog gauges are still reported, so
	// the backlog alerts fire): for a relay run by another deployment, or for
	// an alerting drill.
	RelayEnabled bool `env:"RELAY_ENABLED" envDefault:"true"`
	// RelayMode is poll (outbox rows, the polling relay), cdc (outbox rows,
	// the log-based relay reading the replication stream; rows are deleted
	// once confirmed), wal (events written only to the WAL with
	// cdc.Emit, the log-based relay), or debezium (outbox rows that
	// Debezium publishes from its own slot: no relay runs here; see
	// docs/debezium). See docs/runbook-cdc.md.
	RelayMode string `env:"RELAY_MODE" envDefault:"poll"`
	// DebeziumSlot is, in RELAY_MODE=debezium, the connector's slot.name:
	// its lag and retained WAL are the backlog the service reports, since
	// the outbox table cannot tell what Debezium published.
	DebeziumSlot string `env:"DEBEZIUM_SLOT" envDefault:"debezium_orders_outbox"`
	// ReplicationDatabaseURL is the log-based relay's walsender connection:
	// a role with the REPLICATION attribute. Empty: DATABASE_URL.
	ReplicationDatabaseURL string `env:"REPLICATION_DATABASE_URL"`
	// OutboxSlot is the log-based relay's replication slot; slot names are
	// global to the Postgres cluster, so each service has its own.
	OutboxSlot string `env:"OUTBOX_SLOT" envDefault:"orders_outbox"`
	// OutboxPublishReplicated makes the relay (every mode) publish an event
	// only once every standby streaming through a physical slot has flushed
	// its commit (outbox.Standby): a failover then takes back nothing that
	// was published. A standby down or behind stops publishing, reported as
	// outbox_standby_behind. See docs/operations.md.
	OutboxPublishReplicated bool `env:"OUTBOX_PUBLISH_REPLICATED" envDefault:"false"`
	// PublishMode is outbox (the order and its event commit together, the
	// relay publishes) or naive (commit, then produce directly: the dual
	// write). naive exists only so the fault-injection harness can show it
	// losing events; never run it otherwise.
	PublishMode string `env:"PUBLISH_MODE" envDefault:"outbox"`
	// CrashPoint arms a crash point for fault injection (orders.after-write,
	// outbox.after-ack or outbox.after-slot-created): the process SIGKILLs
	// itself the CrashAfter-th time it gets there. "none" arms nothing.
	CrashPoint string `env:"CRASH_POINT" envDefault:"none"`
}

// apiPoolConns sizes the API's pool (service.Options.PoolConns).
const apiPoolConns = 16

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	var cfg Config
	if err := config.Read(args, getenv, stdout,
		"The orders service: its HTTP API takes orders (POST /orders, GET /orders/:id, POST /orders/:id/cancel) and its outbox relay publishes their events to Kafka.", &cfg); err != nil {
		return err
	}
	svcOpts, err := cfg.Options("orders", cfg.HTTPAddr, cfg.AdminAddr, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	kafkaSecurity := svcOpts.Kafka
	// Orders are taken while Kafka is down; the relay catches up after.
	svcOpts.ReadyWithoutKafka = true
	// Every POST /orders commits, and waits for its WAL flush with a pool
	// connection held: 4 connections (pgxpool's default here) capped the
	// API at 4 orders per flush time (issue 23: about 220 orders/s on a busy
	// machine, the requests queued for a connection). DATABASE_URL's
	// pool_max_conns overrides it.
	svcOpts.PoolConns = apiPoolConns
	svcOpts.Migrations = orders.Schema
	svc, err := service.New(ctx, stdout, svcOpts)
	if err != nil {
		return err
	}
	defer svc.Close()
	crashPoint, err := crash.Point(cfg.CrashPoint, cfg.CrashAfter, svc.Logger, orders.CrashAfterWrite, crashpoint.OutboxAfterAck,
		crashpoint.OutboxAfterSlotCreated)
	if err != nil {
		return err
	}
	ctx = crash.Arm(ctx, crashPoint)
	relayMode, err := outbox.ParseRelayMode(cfg.RelayMode)
	if err != nil {
		return err
	}
	opts := orders.Options{CrashPoint: crashPoint, WriteEvent: cdc.Write(relayMode), QueueEvent: cdc.Queue(relayMode)}
	switch cfg.PublishMode {
	case "outbox":
	case "naive":
		svc.Logger.Warn("PUBLISH_MODE=naive: orders are published by a dual write, without the outbox; for the fault-injection harness only")
		naive := kafkautil.NewWriter(cfg.KafkaBrokers, 1, kafkautil.WithSecurity(kafkaSecurity))
		defer naive.Close()
		opts.NaivePublisher, opts.NaiveTopic = naive, cfg.OrdersTopic
	default:
		return fmt.Errorf("PUBLISH_MODE must be outbox or naive, got %q", cfg.PublishMode)
	}

	metrics := outbox.NewMetrics(svc.Registry)
	relayStage := lifecycle.Stage{Name: "outbox backlog gauges", Run: func(ctx context.Context) error {
		return metrics.WatchBacklog(ctx, svc.Pool, 2*time.Second, svc.Logger)
	}}
	pruneCfg := outbox.PruneConfig{Retention: cfg.OutboxRetention, Archive: cfg.OutboxArchive}
	switch {
	case relayMode.External():
		// Debezium publishes: the table's pending rows are no backlog (they
		// all stay pending), the slot's position is.
		svc.Logger.InfoContext(ctx, "RELAY_MODE=debezium: no relay runs here; Debezium publishes the outbox from its own slot, "+
			"which the backlog gauges read", "slot", cfg.DebeziumSlot, "retention", cfg.OutboxRetention)
		relayStage = lifecycle.Stage{Name: "debezium slot gauges", Run: func(ctx context.Context) error {
			return metrics.WatchSlot(ctx, svc.Pool, cfg.DebeziumSlot, 2*time.Second, svc.Logger)
		}}
		pruneCfg.PendingRetention = cfg.OutboxRetention
	case cfg.RelayEnabled:
		writer := kafkautil.NewWriter(cfg.KafkaBrokers, kafkautil.RelayBatchSize, kafkautil.WithSecurity(kafkaSecurity))
		defer writer.Close()
		relayStage, err = outboxrelay.Stage(ctx, svc, writer, cdc.PublisherConfig{
			Mode: relayMode, Topic: func(string) string { return cfg.OrdersTopic }, Metrics: metrics,
			Poll: outbox.RelayConfig{Standby: outbox.Standby{PublishReplicated: cfg.OutboxPublishReplicated}},
			CDC: cdc.Config{Slot: cfg.OutboxSlot, ReplicationURL: cfg.ReplicationDatabaseURL,
				Standby: outbox.Standby{PublishReplicated: cfg.OutboxPublishReplicated}},
		})
		if err != nil {
			return err
		}
	default:
		svc.Logger.WarnContext(ctx, "the outbox relay is disabled (RELAY_ENABLED=false): orders are taken but not published")
	}
	pruner, err := svc.OutboxOperations(relayMode, pruneCfg)
	if err != nil {
		return err
	}
	orders.Routes(svc.HTTP, orders.New(svc.Pool, opts).WithMetrics(orders.NewMetrics(svc.Registry)))
	return svc.Run(ctx,
		relayStage,
		pruner,
	)
}
