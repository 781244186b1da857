// Package tracing gives every onceflow program OpenTelemetry tracing and
// carries W3C trace context across the three places the platform breaks a
// call chain: an HTTP request, an outbox row and a Kafka message. One trace
// then shows the whole path of an order: the HTTP request to orders, the
// relay publishing its event, billing handling it and publishing the payment,
// the shim forwarding the payment, and the third party booking it.
//
// Setup, called once from the service chassis (or a program's run), installs
// the W3C propagator and, when Config.Exporter is "otlp", a tracer provider
// exporting over OTLP/HTTP, both process-wide as OpenTelemetry expects (its
// instrumentation looks there). With the default "none", no provider is
// installed: spans are OpenTelemetry's no-ops, which cost next to nothing and
// still hand an incoming trace context on unchanged, so a caller's trace id
// survives the platform even when it records nothing itself.
//
// The spans themselves are started where the work happens: the echo server's
// middleware (httpserver), the outbox relay (one producer span per event),
// the inbox consumer (one consumer span per event) and the HTTP client
// transport (Transport). The library's package event converts between a
// context and the W3C traceparent string ("00-<trace id>-<span id>-<flags>")
// that the envelope keeps in the outbox row and the Kafka header
// (event.TraceparentFromContext, event.ContextWithTraceparent).
package tracing
