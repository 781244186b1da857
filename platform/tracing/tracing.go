package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
)

// Exporter names for Config.Exporter.
const (
	ExporterNone = "none"
	ExporterOTLP = "otlp"
)

// Config is the tracing part of a program's configuration. Programs embed it
// in their own Config, so the variables are the standard OpenTelemetry ones.
type Config struct {
	// Exporter is where finished spans go: "otlp" sends them over OTLP/HTTP
	// (protobuf) to Endpoint; "none" records nothing, while trace context
	// still passes through. Default none.
	Exporter string `env:"OTEL_TRACES_EXPORTER" envDefault:"none"`
	// Endpoint is the OTLP/HTTP collector's base URL; spans are posted to
	// Endpoint + "/v1/traces". An https URL uses TLS. Default
	// http://localhost:4318.
	Endpoint string `env:"OTEL_EXPORTER_OTLP_ENDPOINT" envDefault:"http://localhost:4318"`
	// ServiceName is the service.name of every span. Default: the program's
	// own name (orders, billing, reconciler-shim, reconciler).
	ServiceName string `env:"OTEL_SERVICE_NAME"`
	// Sampler decides which new traces are recorded: parentbased_always_on,
	// parentbased_always_off, parentbased_traceidratio, always_on,
	// always_off or traceidratio. The parentbased ones follow the caller's
	// decision when there is a caller. Default parentbased_always_on.
	Sampler string `env:"OTEL_TRACES_SAMPLER" envDefault:"parentbased_always_on"`
	// SamplerArg is the ratio (0 to 1) of the traceidratio samplers.
	// Default 1.
	SamplerArg float64 `env:"OTEL_TRACES_SAMPLER_ARG" envDefault:"1"`
}

// Shutdown flushes the spans not exported yet and stops exporting.
type Shutdown func(context.Context) error

// Setup installs W3C trace-context propagation and, unless cfg.Exporter is
// "none", a tracer provider exporting to cfg.Endpoint, both process-wide
// (otel.SetTextMapPropagator, otel.SetTracerProvider). serviceName is used
// when cfg.ServiceName is empty. OpenTelemetry's own errors (a collector
// that cannot be reached) are logged to logger. Call it once per process,
// from run, and call the returned Shutdown when the program stops: it
// flushes buffered spans.
//
// With "none" the process-wide provider is left as it is: OpenTelemetry's
// no-op, or whatever a test installed.
func Setup(ctx context.Context, cfg Config, serviceName string, logger *slog.Logger) (Shutdown, error) {
	sampler, err := cfg.sampler()
	if err != nil {
		return nil, err
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("opentelemetry failed; spans may be lost", slog.Any("error", err))
	}))
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	switch cfg.Exporter {
	case ExporterNone, "":
		return func(context.Context) error { return nil }, nil
	case ExporterOTLP:
	default:
		return nil, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER %q is not supported (use %q or %q)", cfg.Exporter, ExporterOTLP, ExporterNone)
	}
	endpoint, err := tracesURL(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	exporter, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, fmt.Errorf("tracing: creating the OTLP exporter: %w", err)
	}
	if cfg.ServiceName != "" {
		serviceName = cfg.ServiceName
	}
	// Schemaless, so it merges with the SDK's defaults whatever semconv
	// version those were written with.
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String(string(semconv.ServiceNameKey), serviceName)))
	if err != nil {
		return nil, fmt.Errorf("tracing: building the resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sampler),
	)
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// tracesURL turns the OTLP base URL into the traces endpoint, as the
// OpenTelemetry specification says OTEL_EXPORTER_OTLP_ENDPOINT is read.
func tracesURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("tracing: OTEL_EXPORTER_OTLP_ENDPOINT %q is not an http:// or https:// URL", base)
	}
	u.Path = strings.TrimRight(u.Path, "/") + "/v1/traces"
	return u.String(), nil
}

func (c Config) sampler() (sdktrace.Sampler, error) {
	if c.SamplerArg < 0 || c.SamplerArg > 1 {
		return nil, fmt.Errorf("tracing: OTEL_TRACES_SAMPLER_ARG %v is not a ratio between 0 and 1", c.SamplerArg)
	}
	switch c.Sampler {
	case "parentbased_always_on", "":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SamplerArg)), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(c.SamplerArg), nil
	}
	return nil, fmt.Errorf("tracing: OTEL_TRACES_SAMPLER %q is not supported", c.Sampler)
}
