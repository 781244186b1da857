// Package platform is the service chassis the three onceflow services share:
// configuration from the environment (config), JSON logging (logging),
// Postgres pools and golang-migrate migrations (pgutil), Kafka clients with
// safe defaults (kafkautil), the echo HTTP server with health, readiness and
// metrics endpoints (httpserver), the coded application error (apperr), and
// helpers for tests against the real dev stack (testinfra).
//
// Nothing here is specific to the outbox or the inbox; copy what you need.
package platform
