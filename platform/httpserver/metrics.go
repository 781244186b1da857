package httpserver

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/platform/apperr"
)

// unmatchedRoute is the route label of a request no route matched: the raw
// path would give every scanner's probe a series of its own.
const unmatchedRoute = "unmatched"

// HTTPMetrics are the RED metrics of one listener: requests by route
// template, method and status class, and their duration by route template.
// The duration's observations carry the trace id as an exemplar when the
// request is traced, so a slow bucket leads to its trace (Prometheus keeps
// exemplars when it scrapes OpenMetrics, which the operator listener's
// /metrics serves).
type HTTPMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewHTTPMetrics registers the RED metrics on reg:
//
//	http_requests_total{route, method, status_class}      status_class: 2xx … 5xx
//	http_request_duration_seconds{route, method}          a histogram
//
// route is the route template ("/orders/:id"), never the raw path.
func NewHTTPMetrics(reg prometheus.Registerer) *HTTPMetrics {
	m := &HTTPMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "http_requests_total",
			Help: "HTTP requests answered, by route template, method and status class (2xx, 3xx, 4xx, 5xx).",
		}, []string{"route", "method", "status_class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "http_request_duration_seconds",
			Help: "Time from a request's arrival to its answer, by route template and method; exemplars carry the trace id.",
			// From a cached read (1 ms) to a request waiting out a slow
			// database (the write timeout is 10 s).
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// Middleware counts and times every request but the probes' and the
// scrapers' (/healthz, /readyz, /metrics). Install it inside
// TracingMiddleware, so the request's context has its span.
func (m *HTTPMetrics) Middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if isOperational(c) {
			return next(c)
		}
		start := time.Now()
		err := next(c)
		status := c.Response().Status
		if err != nil && !c.Response().Committed {
			// The error handler has not answered yet: the status is the
			// one it will write.
			status = errorStatus(err)
		}
		route := c.Path()
		// echo's own not-found answer: the route echo reports then is "/*"
		// or the path itself, depending on the router's version.
		if route == "" || errors.Is(err, echo.ErrNotFound) {
			route = unmatchedRoute
		}
		r := c.Request()
		m.requests.WithLabelValues(route, r.Method, strconv.Itoa(status/100)+"xx").Inc()
		obs := m.duration.WithLabelValues(route, r.Method)
		elapsed := time.Since(start).Seconds()
		if sc := trace.SpanContextFromContext(r.Context()); sc.IsSampled() {
			obs.(prometheus.ExemplarObserver).ObserveWithExemplar(elapsed, prometheus.Labels{"trace_id": sc.TraceID().String()})
		} else {
			obs.Observe(elapsed)
		}
		return err
	}
}

// errorStatus is the status the error handler answers err with.
func errorStatus(err error) int {
	if ae, ok := apperr.As(err); ok {
		return apperr.Status(ae.Code)
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return he.Code
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusInternalServerError
}
