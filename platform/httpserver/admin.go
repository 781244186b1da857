package httpserver

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onceflow/onceflow/platform/apperr"
)

// AdminConfig configures NewAdmin, the operator listener.
type AdminConfig struct {
	// Logger receives a record of every operator call and every refused one. Required.
	Logger *slog.Logger
	// Gatherer is served on /metrics, without a token: Prometheus scrapes it,
	// and the listener is private (loopback, or a network only operators and
	// Prometheus reach). Required.
	Gatherer prometheus.Gatherer
	// Token is the bearer token /admin/* and /debug/pprof/* require
	// (ADMIN_TOKEN). Empty: those routes answer 401 telling to set it, even
	// on loopback, because anyone with a shell on the host reaches loopback.
	Token string
	// Pprof mounts net/http/pprof on /debug/pprof/ (behind Token). Default false.
	Pprof bool
	// BodyLimit caps request bodies, in echo's notation. Default "1M".
	BodyLimit string
}

// NewAdmin returns the operator listener's echo: /metrics, /healthz (so a
// probe can tell the listener is up), the bearer-token check in front of
// /admin/* and /debug/pprof/*, and a log record of every non-GET operator
// call with who made it. The caller mounts its /admin/... routes.
func NewAdmin(cfg AdminConfig) *echo.Echo {
	e, bodyLimit := newEcho(cfg.Logger, cfg.BodyLimit)
	e.Use(middleware.Recover())
	e.Use(RequestID)
	e.Use(bearer(cfg.Logger, cfg.Token))
	e.Use(middleware.BodyLimit(bodyLimit))
	e.GET("/healthz", healthz)
	// OpenMetrics when the scraper asks for it (Prometheus does), because
	// only that format carries the exemplars that link a latency bucket to
	// a trace.
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{EnableOpenMetrics: true})))
	if cfg.Pprof {
		// The handlers are mounted one by one on this listener; importing
		// net/http/pprof also registers them on http.DefaultServeMux, which
		// the platform never serves.
		e.GET("/debug/pprof/cmdline", echo.WrapHandler(http.HandlerFunc(pprof.Cmdline)))
		e.GET("/debug/pprof/profile", echo.WrapHandler(http.HandlerFunc(pprof.Profile)))
		e.GET("/debug/pprof/symbol", echo.WrapHandler(http.HandlerFunc(pprof.Symbol)))
		e.POST("/debug/pprof/symbol", echo.WrapHandler(http.HandlerFunc(pprof.Symbol)))
		e.GET("/debug/pprof/trace", echo.WrapHandler(http.HandlerFunc(pprof.Trace)))
		e.GET("/debug/pprof/*", echo.WrapHandler(http.HandlerFunc(pprof.Index)))
	}
	return e
}

// protected tells the paths that need the token.
func protected(path string) bool {
	return strings.HasPrefix(path, "/admin/") || path == "/admin" || strings.HasPrefix(path, "/debug/pprof")
}

// bearer checks "Authorization: Bearer <token>" on the protected paths, in
// constant time (comparing SHA-256 digests, so not even the token's length
// leaks), and logs every operator call that may change something.
func bearer(logger *slog.Logger, token string) echo.MiddlewareFunc {
	want := sha256.Sum256([]byte(token))
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if !protected(r.URL.Path) {
				return next(c)
			}
			who := slog.String("remote_addr", r.RemoteAddr)
			if token == "" {
				logger.WarnContext(r.Context(), "operator call refused: ADMIN_TOKEN is not set",
					slog.String("method", r.Method), slog.String("path", r.URL.Path), who)
				return apperr.Errorf(apperr.Unauthorized, "the operator endpoints are disabled: start the service with ADMIN_TOKEN set, then send Authorization: Bearer <ADMIN_TOKEN>")
			}
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			sum := sha256.Sum256([]byte(got))
			if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
				logger.WarnContext(r.Context(), "operator call refused: missing or wrong bearer token",
					slog.String("method", r.Method), slog.String("path", r.URL.Path), who)
				c.Response().Header().Set("WWW-Authenticate", `Bearer realm="onceflow-admin"`)
				return apperr.Errorf(apperr.Unauthorized, "send Authorization: Bearer <ADMIN_TOKEN>")
			}
			err := next(c)
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				status := c.Response().Status
				var he *echo.HTTPError
				if ae, ok := apperr.As(err); ok {
					status = apperr.Status(ae.Code)
				} else if errors.As(err, &he) {
					status = he.Code
				} else if err != nil {
					status = http.StatusInternalServerError
				}
				logger.InfoContext(r.Context(), "operator call",
					slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", status), who,
					slog.String("request_id", c.Response().Header().Get(apperr.RequestIDHeader)))
			}
			return err
		}
	}
}

// CheckAdminAddr refuses an operator listener that other hosts can reach
// without a token: a non-loopback addr (an empty host listens on every
// interface) needs token. On loopback an empty token is allowed; the
// operator routes then answer 401 (see AdminConfig.Token) and /metrics
// stays available to a local Prometheus.
func CheckAdminAddr(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("ADMIN_ADDR %q is not host:port: %w", addr, err)
	}
	if token != "" || IsLoopback(host) {
		return nil
	}
	return fmt.Errorf("ADMIN_ADDR %s is not a loopback address and ADMIN_TOKEN is empty: "+
		"set ADMIN_TOKEN (the operator endpoints requeue and replay events), or listen on 127.0.0.1", addr)
}

// IsLoopback reports whether host (a name or an IP, without port) is this
// machine only: localhost or a loopback IP.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
