package service

import (
	"time"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/tracing"
)

// Env is the part of the environment every service reads the same way, with
// the same defaults; each service's Config embeds it beside what is its own
// (its addresses, database URL and topics, whose defaults differ per
// service).
type Env struct {
	// HTTP is ADMIN_TOKEN, PPROF, DEBUG_ADDR and the HTTP_* server timeouts
	// (see HTTPConfig).
	HTTP HTTPConfig
	// MigrateDatabaseURL is the schema owner's URL (<service>_owner), used
	// only to migrate at start-up. Empty migrates over DATABASE_URL if that
	// role may create tables and otherwise skips; "none" skips (migrations
	// run as a separate job).
	MigrateDatabaseURL string `env:"MIGRATE_DATABASE_URL"`
	// KafkaBrokers is a comma-separated list of bootstrap brokers.
	KafkaBrokers []string `env:"KAFKA_BROKERS" envDefault:"127.0.0.1:7092"`
	// Kafka is KAFKA_TLS, KAFKA_SASL_MECHANISM and the other Kafka security
	// variables (see kafkautil.SecurityConfig); the default is PLAINTEXT.
	Kafka kafkautil.SecurityConfig
	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// ShutdownGrace is how long in-flight requests get to finish on SIGTERM.
	ShutdownGrace time.Duration `env:"SHUTDOWN_GRACE" envDefault:"10s"`
	// Tracing is OTEL_TRACES_EXPORTER and the other OpenTelemetry variables
	// (see package tracing).
	Tracing tracing.Config
	// CrashAfter is which pass of the service's CRASH_POINT kills the
	// process (1 = the first).
	CrashAfter int `env:"CRASH_AFTER" envDefault:"1"`
}

// Options returns the Options these variables give the service name,
// listening on httpAddr and adminAddr, on its database databaseURL, reaching
// Kafka through the security e.Kafka describes (Options.Kafka, for the
// service's own Kafka clients too); the caller adds what is its own
// (Migrations, ReadyWithoutKafka). It refuses a Kafka security it cannot
// build.
func (e Env) Options(name, httpAddr, adminAddr, databaseURL string) (Options, error) {
	kafka, err := kafkautil.NewSecurity(e.Kafka)
	if err != nil {
		return Options{}, err
	}
	return Options{
		Name: name, HTTPAddr: httpAddr, DatabaseURL: databaseURL, MigrateDatabaseURL: e.MigrateDatabaseURL, KafkaBrokers: e.KafkaBrokers,
		AdminAddr: adminAddr, HTTP: e.HTTP, Kafka: kafka,
		LogLevel: e.LogLevel, ShutdownGrace: e.ShutdownGrace, Tracing: e.Tracing,
	}, nil
}
