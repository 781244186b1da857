// Package platform is the service chassis the three onceflow services share:
// configuration from the environment (config), JSON logging (logging),
// Postgres pools and golang-migrate migrations (pgutil), Kafka clients with
// safe defaults and TLS/SASL (kafkautil), the echo HTTP servers: the public
// one with health and readiness, the operator one with metrics, the
// bearer-token operator routes and opt-in pprof (httpserver, service), the
// coded application error and its one HTTP mapping (apperr), a strict JSON
// decoder (strictjson), and helpers for tests against the real dev stack
// (testinfra).
//
// Nothing here is specific to the outbox or the inbox; copy what you need.
package platform
