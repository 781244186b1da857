// Package httpserver builds the echo servers every service runs: JSON errors
// mapped by apperr.WriteHTTP, a request id on every request, a request body
// limit, structured request logs, a server span per request, and the
// /healthz and /readyz endpoints and the RED metrics of the requests on the
// public listener (New); /metrics (OpenMetrics, with exemplars),
// the operator routes behind a bearer token and opt-in pprof on the operator
// listener (NewAdmin). Serve runs either with the timeouts of Timeouts.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onceflow/onceflow/platform/apperr"
)

// Check reports whether one dependency is usable; /readyz runs every check.
type Check func(ctx context.Context) error

// Config configures New.
type Config struct {
	// Logger receives one record per request and every internal error. Required.
	Logger *slog.Logger
	// Gatherer is served on /metrics. nil serves no /metrics: the public
	// listener of a service leaves it to the operator listener (NewAdmin).
	Gatherer prometheus.Gatherer
	// Registerer receives the listener's RED metrics (NewHTTPMetrics:
	// requests by route template, method and status class, and their
	// duration). nil: none, for a server that has no registry.
	Registerer prometheus.Registerer
	// Checks are run by /readyz, by name. Default: none (always ready).
	Checks map[string]Check
	// BodyLimit caps request bodies, in echo's notation. Default "1M".
	BodyLimit string
}

// newEcho is the bare echo both listeners start from: no banner, and the
// shared error handler, which needs the body limit (default "1M") to name it
// in a 413; it returns the limit with the default applied.
func newEcho(logger *slog.Logger, bodyLimit string) (*echo.Echo, string) {
	if bodyLimit == "" {
		bodyLimit = "1M"
	}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = errorHandler(logger, bodyLimit)
	return e, bodyLimit
}

// healthz answers 200 while the listener is up.
func healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// New returns an echo instance with the shared middleware and endpoints;
// the caller adds its routes.
func New(cfg Config) *echo.Echo {
	e, bodyLimit := newEcho(cfg.Logger, cfg.BodyLimit)
	// Outermost, so a request's span covers everything, panics included.
	e.Use(TracingMiddleware(isOperational))
	if cfg.Registerer != nil {
		// Inside the span, for the exemplars' trace id; outside Recover,
		// so a panic counts as the 500 it becomes.
		e.Use(NewHTTPMetrics(cfg.Registerer).Middleware)
	}
	e.Use(middleware.Recover())
	e.Use(RequestID)
	e.Use(middleware.BodyLimit(bodyLimit))
	e.Use(middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
		LogMethod: true, LogURIPath: true, LogStatus: true, LogLatency: true,
		Skipper: isOperational,
		LogValuesFunc: func(c echo.Context, v middleware.RequestLoggerValues) error {
			cfg.Logger.LogAttrs(c.Request().Context(), slog.LevelDebug, "http request",
				slog.String("method", v.Method), slog.String("path", v.URIPath),
				slog.Int("status", v.Status), slog.Duration("latency", v.Latency))
			return nil
		},
	}))

	e.GET("/healthz", healthz)
	e.GET("/readyz", readyz(cfg.Checks))
	if cfg.Gatherer != nil {
		e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{})))
	}
	return e
}

// RequestID gives every request an id (apperr.RequestIDHeader): the
// client's when it is a valid one, else a new one. It is set on the request,
// so handlers that record it (as an event's correlation id) read a value
// that is safe to store, and on the response, so the client can quote it.
func RequestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		id := r.Header.Get(apperr.RequestIDHeader)
		if !apperr.ValidRequestID(id) {
			id = apperr.NewRequestID()
			r.Header.Set(apperr.RequestIDHeader, id)
		}
		c.Response().Header().Set(apperr.RequestIDHeader, id)
		return next(c)
	}
}

// isOperational tells the probes' and scrapers' requests, which are neither
// logged nor traced.
func isOperational(c echo.Context) bool {
	switch c.Path() {
	case "/healthz", "/readyz", "/metrics":
		return true
	}
	return false
}

func readyz(checks map[string]Check) echo.HandlerFunc {
	return echo.WrapHandler(Ready(checks))
}

// Ready is the /readyz every program of the platform serves, echo or not
// (the reconcile job's plain mux): 200 when every check passes, else 503,
// and always the one body shape, each check's name with "ok" or its error:
//
//	{"kafka":"ok","postgres":"dial tcp 127.0.0.1:7432: connection refused"}
//
// A program with no dependency to check still names what it is ready for,
// so that a client reads the same shape everywhere.
func Ready(checks map[string]Check) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// Names are read per request: a service adds its workers' checks
		// after building the server (service.Service.AddCheck).
		names := make([]string, 0, len(checks))
		for n := range checks {
			names = append(names, n)
		}
		sort.Strings(names)
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		status, result := http.StatusOK, make(map[string]string, len(checks))
		for _, n := range names {
			if err := checks[n](ctx); err != nil {
				status, result[n] = http.StatusServiceUnavailable, err.Error()
				continue
			}
			result[n] = "ok"
		}
		apperr.WriteJSON(w, status, result)
	}
}

// Healthz is /healthz outside echo: 200 {"status":"ok"} while the listener
// is up, the body healthz gives on every listener.
func Healthz(w http.ResponseWriter, _ *http.Request) {
	apperr.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// ErrorBody is the JSON body of every error response (apperr.ErrorBody).
type ErrorBody = apperr.ErrorBody

// errorHandler hands every error to apperr.WriteHTTP, the one mapper;
// echo's own errors (no route, wrong method, the body limit) are translated
// first.
func errorHandler(logger *slog.Logger, bodyLimit string) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		w, r := c.Response(), c.Request()
		var he *echo.HTTPError
		if _, ok := apperr.As(err); !ok && errors.As(err, &he) {
			switch {
			case he.Code == http.StatusRequestEntityTooLarge:
				err = apperr.Errorf(apperr.TooLarge, "request body is larger than the limit of %sB", bodyLimit)
			case he.Code < 500:
				// echo's router and middleware answer in apperr's
				// vocabulary too: one set of codes for every client.
				var body ErrorBody
				body.Error.Code, body.Error.Message = string(echoCode(he.Code)), http.StatusText(he.Code)
				switch {
				case he.Code == http.StatusNotFound:
					body.Error.Message = "no route for " + r.Method + " " + apperr.Quote(r.URL.Path)
				case he.Code == http.StatusMethodNotAllowed:
					body.Error.Message = r.Method + " is not allowed on " + apperr.Quote(r.URL.Path)
				default:
					if m, ok := he.Message.(string); ok {
						body.Error.Message = m
					}
				}
				writeBody(w, r, he.Code, body)
				return
			}
		}
		if r.Method == http.MethodHead {
			// No body for HEAD: the status (and the request id) are the answer.
			rec := &statusOnly{ResponseWriter: w}
			apperr.WriteHTTP(rec, r, logger, err)
			return
		}
		apperr.WriteHTTP(w, r, logger, err)
	}
}

// echoCode is the apperr code of a 4xx echo answers by itself.
func echoCode(status int) apperr.Code {
	switch status {
	case http.StatusNotFound:
		// Only echo's router answers 404 here; a handler's is an apperr.
		return apperr.NoRoute
	case http.StatusMethodNotAllowed:
		return apperr.MethodNotAllowed
	case http.StatusUnauthorized, http.StatusForbidden:
		return apperr.Unauthorized
	case http.StatusUnsupportedMediaType:
		return apperr.UnsupportedMediaType
	case http.StatusRequestEntityTooLarge:
		return apperr.TooLarge
	case http.StatusConflict:
		return apperr.Conflict
	case http.StatusUnprocessableEntity:
		return apperr.Invalid
	}
	return apperr.Malformed
}

func writeBody(w http.ResponseWriter, r *http.Request, status int, body ErrorBody) {
	if r.Method == http.MethodHead {
		w.WriteHeader(status)
		return
	}
	apperr.WriteJSON(w, status, body)
}

// statusOnly drops the body of a HEAD response.
type statusOnly struct{ http.ResponseWriter }

func (s *statusOnly) Write(b []byte) (int, error) { return len(b), nil }

// Serve serves h on ln with the limits of t until ctx ends, then shuts down
// gracefully, letting in-flight requests finish for up to grace.
func Serve(ctx context.Context, h http.Handler, ln net.Listener, grace time.Duration, t Timeouts) error {
	srv := t.Server(h)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("http shutdown: %w", err)
	}
	return nil
}
