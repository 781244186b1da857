package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/onceflow/onceflow/pkg/crashpoint"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/platform/config"
	"github.com/onceflow/onceflow/platform/crash"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/lifecycle"
	"github.com/onceflow/onceflow/platform/outboxrelay"
	"github.com/onceflow/onceflow/platform/service"
	"github.com/onceflow/onceflow/services/billing"
)

// Config is the billing service's configuration, read from the environment.
type Config struct {
	// Env is what every service reads the same way: ADMIN_TOKEN and the
	// other HTTP settings, MIGRATE_DATABASE_URL, KAFKA_BROKERS and Kafka's
	// security, LOG_LEVEL, SHUTDOWN_GRACE, tracing and CRASH_AFTER.
	service.Env
	// HTTPAddr is where the read API, /healthz and /readyz listen.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:"127.0.0.1:8082"`
	// AdminAddr is the operator listener: /metrics, /admin/outbox/...,
	// /admin/inbox/... and, with
	// PPROF=true, /debug/pprof/. Loopback by default; any other address
	// needs ADMIN_TOKEN.
	AdminAddr string `env:"ADMIN_ADDR" envDefault:"127.0.0.1:9082"`
	// DatabaseURL is the service's own Postgres database, as its runtime role
	// (billing_app: reads and writes the tables, no DDL; see package pgroles).
	DatabaseURL string `env:"DATABASE_URL" envDefault:"postgres://billing_app:billing_app@127.0.0.1:7432/billing?sslmode=disable"`
	// OrdersTopic is consumed; its dead letters go to OrdersTopic + ".dlt".
	OrdersTopic string `env:"ORDERS_TOPIC" envDefault:"orders.events"`
	// BillingTopic receives every payment event.
	BillingTopic string `env:"BILLING_TOPIC" envDefault:"billing.events"`
	// ConsumerGroup is the Kafka consumer group (see InboxName for the inbox's).
	ConsumerGroup string `env:"CONSUMER_GROUP" envDefault:"billing"`
	// RelayMode is poll (outbox rows, the polling relay), cdc (outbox rows,
	// the log-based relay reading the replication stream; rows are deleted
	// once confirmed) or wal (events written only to the WAL with
	// cdc.Emit, the log-based relay). See docs/runbook-cdc.md.
	RelayMode string `env:"RELAY_MODE" envDefault:"poll"`
	// ReplicationDatabaseURL is the log-based relay's walsender connection:
	// a role with the REPLICATION attribute. Empty: DATABASE_URL.
	ReplicationDatabaseURL string `env:"REPLICATION_DATABASE_URL"`
	// OutboxSlot is the log-based relay's replication slot; slot names are
	// global to the Postgres cluster, so each service has its own.
	OutboxSlot string `env:"OUTBOX_SLOT" envDefault:"billing_outbox"`
	// OutboxPublishReplicated makes the relay (every mode) publish an event
	// only once every standby streaming through a physical slot has flushed
	// its commit (outbox.Standby): a failover then takes back nothing that
	// was published. A standby down or behind stops publishing, reported as
	// outbox_standby_behind. See docs/operations.md.
	OutboxPublishReplicated bool `env:"OUTBOX_PUBLISH_REPLICATED" envDefault:"false"`
	// InboxCommitReplicated makes the consumer commit its Kafka offsets only
	// for work every standby streaming through a physical slot has flushed
	// (inbox.Config.CommitReplicated): after a failover to an asynchronous
	// standby, the messages whose effects died with the old primary are
	// delivered again instead of skipped. A standby down or behind holds
	// the offsets back, reported as inbox_standby_connected 0. See
	// docs/operations.md.
	InboxCommitReplicated bool `env:"INBOX_COMMIT_REPLICATED" envDefault:"false"`
	// OutboxRetention is how long published outbox rows are kept before the
	// pruner removes them.
	OutboxRetention time.Duration `env:"OUTBOX_RETENTION" envDefault:"168h"`
	// OutboxArchive moves pruned rows to outbox_events_archive instead of
	// deleting them (for audit trails that outlive the retention window).
	OutboxArchive bool `env:"OUTBOX_ARCHIVE" envDefault:"false"`
	// InboxName is the inbox's dedupe namespace (inbox_messages.consumer).
	// It stays when the consumer group changes (a reset, a replay into a
	// fresh group), so the inbox still recognises what it already applied.
	InboxName string `env:"INBOX_NAME" envDefault:"billing"`
	// InboxMode is inbox (dedupe per event id, in the charge's transaction)
	// or naive (no inbox: every delivery is applied). naive exists only so
	// the fault-injection harness can show it duplicating; never run it
	// otherwise.
	InboxMode string `env:"INBOX_MODE" envDefault:"inbox"`
	// CrashPoint arms a crash point for fault injection (inbox.after-commit,
	// outbox.after-ack or outbox.after-slot-created): the process SIGKILLs
	// itself the CrashAfter-th time it gets there. "none" arms nothing.
	CrashPoint string `env:"CRASH_POINT" envDefault:"none"`
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	var cfg Config
	if err := config.Read(args, getenv, stdout,
		"The billing service: consumes order events through its inbox, charges or refunds, and publishes payment events through its outbox.", &cfg); err != nil {
		return err
	}
	relayMode, err := outbox.ParseRelayMode(cfg.RelayMode)
	if err != nil {
		return err
	}
	if relayMode == outbox.ModeDebezium {
		// The shipped connector publishes orders' outbox only; billing's
		// payments need a relay of their own (docs/debezium).
		return fmt.Errorf("RELAY_MODE=debezium is for orders; billing runs poll, cdc or wal")
	}
	svcOpts, err := cfg.Options("billing", cfg.HTTPAddr, cfg.AdminAddr, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	kafkaSecurity := svcOpts.Kafka
	svcOpts.Migrations = billing.Schema
	svc, err := service.New(ctx, stdout, svcOpts)
	if err != nil {
		return err
	}
	defer svc.Close()
	crashPoint, err := crash.Point(cfg.CrashPoint, cfg.CrashAfter, svc.Logger, crashpoint.InboxAfterCommit, crashpoint.OutboxAfterAck,
		crashpoint.OutboxAfterSlotCreated)
	if err != nil {
		return err
	}
	ctx = crash.Arm(ctx, crashPoint)

	writer := kafkautil.NewWriter(cfg.KafkaBrokers, kafkautil.RelayBatchSize, kafkautil.WithSecurity(kafkaSecurity))
	defer writer.Close()
	relay, err := outboxrelay.Stage(ctx, svc, writer, cdc.PublisherConfig{
		Mode: relayMode, Topic: func(string) string { return cfg.BillingTopic }, Metrics: outbox.NewMetrics(svc.Registry),
		Poll: outbox.RelayConfig{Standby: outbox.Standby{PublishReplicated: cfg.OutboxPublishReplicated}},
		CDC: cdc.Config{Slot: cfg.OutboxSlot, ReplicationURL: cfg.ReplicationDatabaseURL,
			Standby: outbox.Standby{PublishReplicated: cfg.OutboxPublishReplicated}},
	})
	if err != nil {
		return err
	}
	outboxPruner, err := svc.OutboxOperations(relayMode, outbox.PruneConfig{Retention: cfg.OutboxRetention, Archive: cfg.OutboxArchive})
	if err != nil {
		return err
	}

	b := billing.New(svc.Pool, svc.Logger, nil).WithRelayMode(relayMode)
	src := inbox.GroupConfig{Brokers: cfg.KafkaBrokers, Topic: cfg.OrdersTopic, Group: cfg.ConsumerGroup,
		Dialer: kafkaSecurity.Dialer()}
	consumer, err := inbox.NewBatchConsumer(svc.Pool, src, writer, b, inbox.Config{
		Name:             cfg.InboxName,
		CommitReplicated: cfg.InboxCommitReplicated,
		ShutdownGrace:    cfg.ShutdownGrace,
		Logger:           svc.Logger,
		Metrics:          inbox.NewMetrics(svc.Registry),
	})
	if err != nil {
		return err
	}
	consume := consumer.Run
	switch cfg.InboxMode {
	case "inbox":
		svc.AddCheck("orders_consumer", func(context.Context) error { return consumer.Healthy() })
	case "naive":
		svc.Logger.Warn("INBOX_MODE=naive: orders events are applied without the inbox; for the fault-injection harness only")
		reader := kafkautil.NewGroupReaderWith(kafkaSecurity, cfg.KafkaBrokers, cfg.OrdersTopic, cfg.ConsumerGroup)
		defer reader.Close() // after Run: flushes the last offset commits
		consume = (&billing.NaiveConsumer{Pool: svc.Pool, Reader: reader, Handle: b.HandleNaive,
			CrashPoint: crashPoint, Logger: svc.Logger}).Run
	default:
		return fmt.Errorf("INBOX_MODE must be inbox or naive, got %q", cfg.InboxMode)
	}
	inboxPruner, err := svc.InboxOperations(writer, cfg.OrdersTopic)
	if err != nil {
		return err
	}
	billing.Routes(svc.HTTP, b)
	return svc.Run(ctx,
		lifecycle.Stage{Name: "orders consumer", Run: consume},
		inboxPruner,
		relay,
		outboxPruner,
	)
}
