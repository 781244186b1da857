// Package e2e holds the tests that run the platform's programs as built
// binaries, each in its own process as in production, against the real
// PostgreSQL and Kafka of the dev stack (`make up`).
//
// TestOneTraceFromTheHTTPRequestToTheThirdParty follows one order through
// orders, Kafka, billing, Kafka, the shim and the third-party reconciler, and
// asserts that OpenTelemetry's trace id survives the whole path with every
// span's parent where it belongs.
package e2e
