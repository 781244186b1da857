package harness

import (
	"fmt"
	"slices"
	"strings"
)

// Var is one environment variable of a program's contract.
type Var struct {
	// Name is the variable, e.g. DATABASE_URL.
	Name string
	// Required variables have no default a harness could use: the program's
	// defaults point at the dev stack's fixed ports and names, which a
	// platform of its own must not share.
	Required bool
	// Meaning says what the value is.
	Meaning string
}

// Spec is one program of the platform: how to build it and what it reads.
type Spec struct {
	// Name is the binary's name (the last element of Package) and the name
	// of its log.
	Name string
	// Package is the main package, relative to the repository root.
	Package string
	// Compose is the program's service name in docker-compose.yml.
	Compose string
	// Env lists the variables a harness sets. It is not every variable the
	// program reads (see the Config of its run.go for those), only the ones
	// a harness sets or may set; CheckSpec keeps it a subset.
	Env []Var
}

// Vars that every program reads, which Start sets itself (the addresses)
// or which a caller may set.
var common = []Var{
	{Name: "HTTP_ADDR", Required: true, Meaning: "the public listener (API, /healthz, /readyz); Proc picks a port it keeps across restarts"},
	{Name: "ADMIN_ADDR", Required: true, Meaning: "the operator listener (/metrics, /admin/…); Proc picks a port it keeps across restarts"},
	{Name: "ADMIN_TOKEN", Meaning: "the bearer token of /admin/…; without it those answer 401"},
	{Name: "PPROF", Meaning: "true serves /debug/pprof/ on the operator listener"},
	{Name: "DEBUG_ADDR", Meaning: "an opt-in pprof listener (empty: off); the bench rig sets one per program"},
	{Name: "LOG_LEVEL", Meaning: "debug, info, warn or error"},
	{Name: "OTEL_TRACES_EXPORTER", Meaning: "none or otlp"},
	{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Meaning: "the OTLP/HTTP collector"},
	{Name: "OTEL_SERVICE_NAME", Meaning: "the service name of the exported spans"},
}

// The variables of the three services (not the reconciler stand-in).
var (
	databaseURL = Var{Name: "DATABASE_URL", Required: true, Meaning: "the service's database, as its runtime role"}
	migrateURL  = Var{Name: "MIGRATE_DATABASE_URL", Meaning: "the schema owner's URL; empty migrates over DATABASE_URL when that role may"}
	brokers     = Var{Name: "KAFKA_BROKERS", Required: true, Meaning: "Kafka bootstrap brokers, comma-separated"}
	grace       = Var{Name: "SHUTDOWN_GRACE", Meaning: "how long SIGTERM waits for in-flight work"}
	crashPoint  = Var{Name: "CRASH_POINT", Meaning: "a named crash point to SIGKILL itself at (fault injection)"}
	crashAfter  = Var{Name: "CRASH_AFTER", Meaning: "the pass of CRASH_POINT that crashes"}
	relayMode   = Var{Name: "RELAY_MODE", Meaning: "poll, cdc or wal (orders also debezium: no relay, Debezium publishes)"}
	replication = Var{Name: "REPLICATION_DATABASE_URL", Meaning: "the log-based relay's walsender connection"}
	outboxSlot  = Var{Name: "OUTBOX_SLOT", Meaning: "the log-based relay's replication slot (cluster-wide name)"}
)

// The platform's programs.
var (
	// Orders takes orders over HTTP and relays its outbox.
	Orders = Spec{Name: "orders", Package: "./services/orders/cmd/orders", Compose: "orders", Env: append(slices.Clone(common),
		databaseURL, migrateURL, brokers, grace, crashPoint, crashAfter, relayMode, replication, outboxSlot,
		Var{Name: "ORDERS_TOPIC", Required: true, Meaning: "the topic of its events"},
		Var{Name: "PUBLISH_MODE", Meaning: "outbox, or naive (dual write, for the proofs)"},
		Var{Name: "RELAY_ENABLED", Meaning: "false runs the API only"},
		Var{Name: "DEBEZIUM_SLOT", Meaning: "RELAY_MODE=debezium: the connector's replication slot, whose lag is the backlog"},
	)}
	// Billing consumes orders' events through its inbox and relays its own.
	Billing = Spec{Name: "billing", Package: "./services/billing/cmd/billing", Compose: "billing", Env: append(slices.Clone(common),
		databaseURL, migrateURL, brokers, grace, crashPoint, crashAfter, relayMode, replication, outboxSlot,
		Var{Name: "ORDERS_TOPIC", Required: true, Meaning: "the topic it consumes"},
		Var{Name: "BILLING_TOPIC", Required: true, Meaning: "the topic of its events"},
		Var{Name: "CONSUMER_GROUP", Required: true, Meaning: "its Kafka consumer group"},
		Var{Name: "INBOX_NAME", Meaning: "the inbox's dedupe namespace"},
		Var{Name: "INBOX_MODE", Meaning: "inbox, or naive (no dedupe, for the proofs)"},
	)}
	// Shim consumes billing's events and forwards each payment to the
	// third party once.
	Shim = Spec{Name: "shim", Package: "./services/reconciler-shim/cmd/shim", Compose: "reconciler-shim", Env: append(slices.Clone(common),
		databaseURL, migrateURL, brokers, grace, crashPoint, crashAfter,
		Var{Name: "BILLING_TOPIC", Required: true, Meaning: "the topic it consumes"},
		Var{Name: "CONSUMER_GROUP", Required: true, Meaning: "its Kafka consumer group"},
		Var{Name: "RECONCILER_URL", Required: true, Meaning: "the third party's base URL"},
		Var{Name: "RECONCILER_TIMEOUT", Meaning: "how long a call to the third party may take"},
	)}
	// Reconciler is the third party's stand-in: it books settlements in a
	// ledger file and counts duplicates.
	Reconciler = Spec{Name: "reconciler", Package: "./services/reconciler-shim/cmd/reconciler", Compose: "reconciler", Env: append(slices.Clone(common),
		Var{Name: "LEDGER_PATH", Required: true, Meaning: "the ledger file (JSON lines)"},
	)}
)

// Programs are the platform's programs in the order they start: each one's
// downstream before it. Stop them in reverse.
var Programs = []Spec{Reconciler, Shim, Billing, Orders}

// Missing lists the required variables env does not set (or sets empty).
func (s Spec) Missing(env map[string]string) []string {
	var out []string
	for _, v := range s.Env {
		if v.Required && env[v.Name] == "" {
			out = append(out, v.Name)
		}
	}
	return out
}

// CheckSpec compares s with the names of the variables the program reads
// (config.Vars of its Config): every variable of s must be one of them, so
// a renamed variable fails the program's own tests instead of being set
// in vain by every harness.
func CheckSpec(s Spec, reads []string) error {
	var unknown []string
	for _, v := range s.Env {
		if !slices.Contains(reads, v.Name) {
			unknown = append(unknown, v.Name)
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("harness spec %s names %s, which the program does not read", s.Name, strings.Join(unknown, ", "))
	}
	return nil
}
