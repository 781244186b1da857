// Package httpserver builds the echo server every service runs: JSON errors
// mapped from apperr codes in one place, a request body limit, structured
// request logs, a server span per request, and the
// /healthz, /readyz and /metrics endpoints.
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

	"github.com/onceflow/onceflow/pkg/platform/apperr"
)

// Check reports whether one dependency is usable; /readyz runs every check.
type Check func(ctx context.Context) error

// Config configures New.
type Config struct {
	// Logger receives one record per request and every internal error. Required.
	Logger *slog.Logger
	// Gatherer is served on /metrics. Required.
	Gatherer prometheus.Gatherer
	// Checks are run by /readyz, by name. Default: none (always ready).
	Checks map[string]Check
	// BodyLimit caps request bodies, in echo's notation. Default "1M".
	BodyLimit string
}

// New returns an echo instance with the shared middleware and endpoints;
// the caller adds its routes.
func New(cfg Config) *echo.Echo {
	if cfg.BodyLimit == "" {
		cfg.BodyLimit = "1M"
	}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = errorHandler(cfg.Logger, cfg.BodyLimit)
	// Outermost, so a request's span covers everything, panics included.
	e.Use(TracingMiddleware(isOperational))
	e.Use(middleware.Recover())
	e.Use(middleware.BodyLimit(cfg.BodyLimit))
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

	e.GET("/healthz", func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
	})
	e.GET("/readyz", readyz(cfg.Checks))
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{})))
	return e
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
	return func(c echo.Context) error {
		// Names are read per request: a service adds its workers' checks
		// after building the server (service.Service.AddCheck).
		names := make([]string, 0, len(checks))
		for n := range checks {
			names = append(names, n)
		}
		sort.Strings(names)
		ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
		defer cancel()
		status, result := http.StatusOK, make(map[string]string, len(checks))
		for _, n := range names {
			if err := checks[n](ctx); err != nil {
				status, result[n] = http.StatusServiceUnavailable, err.Error()
				continue
			}
			result[n] = "ok"
		}
		return c.JSON(status, result)
	}
}

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

var statusOf = map[apperr.Code]int{
	apperr.Malformed: http.StatusBadRequest,
	apperr.Invalid:   http.StatusUnprocessableEntity,
	apperr.NotFound:  http.StatusNotFound,
	apperr.Conflict:  http.StatusConflict,
	apperr.TooLarge:  http.StatusRequestEntityTooLarge,
}

// errorHandler is the one place an error becomes an HTTP status.
func errorHandler(logger *slog.Logger, bodyLimit string) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		var body ErrorBody
		status := http.StatusInternalServerError
		var he *echo.HTTPError
		if ae, ok := apperr.As(err); ok {
			status, body.Error.Code, body.Error.Message = statusOf[ae.Code], string(ae.Code), ae.Message
		} else if errors.As(err, &he) {
			status, body.Error.Code, body.Error.Message = he.Code, "http_"+fmt.Sprint(he.Code), fmt.Sprint(he.Message)
			if he.Code == http.StatusRequestEntityTooLarge {
				body.Error.Code, body.Error.Message = string(apperr.TooLarge), "request body is larger than the limit of "+bodyLimit+"B"
			}
		} else {
			logger.ErrorContext(c.Request().Context(), "request failed",
				slog.String("method", c.Request().Method), slog.String("path", c.Path()), slog.Any("error", err))
			body.Error.Code, body.Error.Message = "internal", "internal error; see the service log"
		}
		if status == 0 {
			status = http.StatusInternalServerError
		}
		if c.Request().Method == http.MethodHead {
			err = c.NoContent(status)
		} else {
			err = c.JSON(status, body)
		}
		if err != nil {
			logger.ErrorContext(c.Request().Context(), "writing error response", slog.Any("error", err))
		}
	}
}

// Serve runs e on addr until ctx ends, then shuts down gracefully, letting
// in-flight requests finish for up to grace.
func Serve(ctx context.Context, e *echo.Echo, ln net.Listener, grace time.Duration) error {
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 5 * time.Second}
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
