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
// The string form of a trace context is the W3C traceparent header
// ("00-<trace id>-<span id>-<flags>"), the form the event envelope keeps
// (event.Envelope.Traceparent) in the outbox row and the Kafka header:
// Traceparent reads it from a context, ContextWithTraceparent puts it back.
// Middleware traces the requests an echo server handles and Transport the
// requests an http.Client sends.
package tracing
