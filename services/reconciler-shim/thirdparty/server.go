package thirdparty

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/httpserver"
)

// IdempotencyKeyHeader carries the caller's key for a settlement. The third
// party stores it and lets callers look it up, but does not deduplicate on it.
const IdempotencyKeyHeader = "Idempotency-Key"

// MaxKeyLength is the longest Idempotency-Key accepted, in bytes.
const MaxKeyLength = 255

// SettleRequest is the body of POST /settlements.
type SettleRequest struct {
	PaymentID string `json:"paymentId"`
	OrderID   string `json:"orderId"`
	// Kind is KindCapture or KindRefund.
	Kind string `json:"kind"`
	// AmountCents is positive; a refund is told apart by Kind, not by sign.
	AmountCents int64 `json:"amountCents"`
	// Currency is an ISO 4217 code such as "EUR".
	Currency string `json:"currency"`
}

type server struct {
	ledger *Ledger
	logger *slog.Logger
	faults faultState
}

// Servers are the stand-in's two HTTP handlers, for its two listeners.
type Servers struct {
	// Public is the API: POST /settlements, GET /settlements,
	// GET /settlements/:key, GET /stats, /healthz and /readyz.
	Public *echo.Echo
	// Admin is the operator listener (httpserver.NewAdmin): /metrics, and
	// GET and POST /admin/faults behind the bearer token.
	Admin *echo.Echo
}

// AdminOptions configure the stand-in's operator listener.
type AdminOptions struct {
	// Token is the bearer token /admin/faults requires (ADMIN_TOKEN); empty
	// refuses every call with 401.
	Token string
	// Pprof serves /debug/pprof/ behind the token.
	Pprof bool
}

// NewServer returns the third party's HTTP API over l and its operator
// listener, built on the platform chassis (JSON errors, request ids). Its
// metrics are registered with reg, which must also be a prometheus.Gatherer
// (a *prometheus.Registry is both) because the operator's /metrics serves it.
func NewServer(l *Ledger, logger *slog.Logger, reg prometheus.Registerer, admin AdminOptions) (Servers, error) {
	gatherer, ok := reg.(prometheus.Gatherer)
	if !ok {
		return Servers{}, errors.New("thirdparty: the metrics registerer must also be a prometheus.Gatherer, such as *prometheus.Registry")
	}
	if err := reg.Register(newLedgerCollector(l)); err != nil {
		return Servers{}, fmt.Errorf("registering reconciler metrics: %w", err)
	}
	s := &server{ledger: l, logger: logger}
	e := httpserver.New(httpserver.Config{Logger: logger, Registerer: reg,
		Checks: map[string]httpserver.Check{"ledger": l.Ready}})
	e.POST("/settlements", s.settle)
	e.GET("/settlements", s.list)
	e.GET("/settlements/:key", s.byKey)
	e.GET("/stats", s.stats)
	a := httpserver.NewAdmin(httpserver.AdminConfig{Logger: logger, Gatherer: gatherer, Token: admin.Token, Pprof: admin.Pprof})
	a.GET("/admin/faults", s.getFaults)
	a.POST("/admin/faults", s.setFaults)
	return Servers{Public: e, Admin: a}, nil
}

func (s *server) settle(c echo.Context) error {
	ctx := c.Request().Context()
	key := c.Request().Header.Get(IdempotencyKeyHeader)
	if strings.TrimSpace(key) == "" {
		return apperr.Errorf(apperr.Malformed, "the %s header is required", IdempotencyKeyHeader)
	}
	if err := apperr.CheckText("the "+IdempotencyKeyHeader+" header", key); err != nil {
		return err
	}
	var req SettleRequest
	if err := httpserver.DecodeJSON(c.Request().Body, &req); err != nil {
		return err
	}
	if err := validateSettle(key, req); err != nil {
		return err
	}

	// Faults are taken only by requests that would otherwise be booked, so a
	// test's fault count is never used up by its own invalid requests.
	f, hangFor := s.faults.take()
	if f == failFault {
		s.logger.InfoContext(ctx, "injected failure, settlement not booked", slog.String("idempotency_key", key))
		var body httpserver.ErrorBody
		body.Error.Code, body.Error.Message = "injected_fault", "injected failure (failNext): nothing was booked"
		return c.JSON(http.StatusInternalServerError, body)
	}
	if f == rejectFault {
		s.logger.InfoContext(ctx, "injected rejection, settlement not booked", slog.String("idempotency_key", key))
		var body httpserver.ErrorBody
		body.Error.Code, body.Error.Message = "injected_rejection", "injected rejection (rejectNext): nothing was booked"
		return c.JSON(http.StatusUnprocessableEntity, body)
	}
	if f == slowFault {
		t := time.NewTimer(hangFor)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			// The caller gave up before anything was booked: a sound third
			// party drops an unfinished request.
			s.logger.InfoContext(ctx, "injected slowness, caller gave up, settlement not booked", slog.String("idempotency_key", key))
			return ctx.Err()
		}
	}

	stored, n, err := s.ledger.append(Settlement{
		IdempotencyKey: key,
		PaymentID:      req.PaymentID,
		OrderID:        req.OrderID,
		Kind:           req.Kind,
		AmountCents:    req.AmountCents,
		Currency:       req.Currency,
		TraceID:        traceID(ctx),
	})
	if err != nil {
		return fmt.Errorf("booking settlement: %w", err)
	}
	if n > 1 {
		s.logger.WarnContext(ctx, "duplicate settlement booked",
			slog.String("idempotency_key", key), slog.String("payment_id", req.PaymentID), slog.Int("count", n))
	}

	if f == bookRejectFault {
		s.logger.InfoContext(ctx, "injected rejection after booking", slog.String("idempotency_key", key))
		var body httpserver.ErrorBody
		body.Error.Code, body.Error.Message = "injected_rejection", "injected rejection (bookRejectNext): the settlement WAS booked"
		return c.JSON(http.StatusUnprocessableEntity, body)
	}
	if f == hangFault {
		// Booked already: the caller's timeout cannot undo it, which is the point.
		s.logger.InfoContext(ctx, "injected hang after booking",
			slog.String("idempotency_key", key), slog.Duration("hang_for", hangFor))
		t := time.NewTimer(hangFor)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done(): // the caller gave up; holding the answer longer only delays shutdown
		}
	}
	return c.JSON(http.StatusCreated, stored)
}

// traceID is the id of the trace the request's server span belongs to (the
// caller's, when it sent a traceparent), or "".
func traceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}

func (s *server) byKey(c echo.Context) error {
	// echo hands over the raw path segment when the request path needed
	// escaping (RawPath set), so keys with '/', '%' or spaces must be decoded
	// here to match the header value they were stored under.
	key := c.Param("key")
	if c.Request().URL.RawPath != "" {
		k, err := url.PathUnescape(key)
		if err != nil {
			return apperr.Errorf(apperr.Malformed, "idempotency key in the path is not valid escaping")
		}
		key = k
	}
	found := s.ledger.ByKey(key)
	if len(found) == 0 {
		return apperr.Errorf(apperr.NotFound, "no settlement under idempotency key %s", apperr.Quote(key))
	}
	return c.JSON(http.StatusOK, found)
}

func (s *server) list(c echo.Context) error {
	return c.JSON(http.StatusOK, s.ledger.All())
}

func (s *server) stats(c echo.Context) error {
	return c.JSON(http.StatusOK, s.ledger.Stats())
}

func (s *server) getFaults(c echo.Context) error {
	return c.JSON(http.StatusOK, s.faults.get())
}

func (s *server) setFaults(c echo.Context) error {
	var in Faults
	if err := httpserver.DecodeJSON(c.Request().Body, &in); err != nil {
		return err
	}
	if err := s.faults.set(in); err != nil {
		return err
	}
	s.logger.InfoContext(c.Request().Context(), "fault injection set by an operator",
		slog.Int("fail_next", in.FailNext), slog.Int("reject_next", in.RejectNext), slog.Int("hang_next", in.HangNext), slog.String("hang_for", in.HangFor),
		slog.String("remote_addr", c.Request().RemoteAddr))
	return c.JSON(http.StatusOK, s.faults.get())
}

// validateSettle reports every broken rule at once, so a caller fixes its
// request in one round trip.
func validateSettle(key string, r SettleRequest) error {
	var problems []string
	if len(key) > MaxKeyLength {
		problems = append(problems, fmt.Sprintf("%s is longer than %d bytes", IdempotencyKeyHeader, MaxKeyLength))
	}
	if strings.TrimSpace(r.PaymentID) == "" {
		problems = append(problems, "paymentId is required")
	}
	if strings.TrimSpace(r.OrderID) == "" {
		problems = append(problems, "orderId is required")
	}
	if r.Kind != KindCapture && r.Kind != KindRefund {
		problems = append(problems, fmt.Sprintf("kind must be %q or %q", KindCapture, KindRefund))
	}
	if r.AmountCents <= 0 {
		problems = append(problems, "amountCents must be positive")
	}
	if !isCurrencyCode(r.Currency) {
		problems = append(problems, "currency must be a 3-letter upper-case ISO 4217 code")
	}
	if len(problems) > 0 {
		return apperr.Errorf(apperr.Invalid, "%s", strings.Join(problems, "; "))
	}
	return nil
}

func isCurrencyCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, r := range s {
		if r < 'A' || r > 'Z' {
			return false
		}
	}
	return true
}

// ledgerCollector reads the metrics from the ledger at scrape time rather
// than counting requests, so they agree with /stats, include what was loaded
// from the file after a restart, and cannot drift from the audit.
type ledgerCollector struct {
	ledger      *Ledger
	settlements *prometheus.Desc
	duplicates  *prometheus.Desc
	fsyncs      *prometheus.Desc
}

func newLedgerCollector(l *Ledger) *ledgerCollector {
	return &ledgerCollector{
		ledger: l,
		settlements: prometheus.NewDesc("reconciler_settlements_total",
			"Settlements the third-party reconciler booked, duplicates included.", []string{"kind"}, nil),
		duplicates: prometheus.NewDesc("reconciler_duplicate_settlements_total",
			"Settlements booked under an idempotency key that already had one.", nil, nil),
		fsyncs: prometheus.NewDesc("reconciler_ledger_fsyncs_total",
			"Fsyncs of the ledger file since start; concurrent bookings share one (group commit).", nil, nil),
	}
}

func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.settlements
	ch <- c.duplicates
	ch <- c.fsyncs
}

func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.ledger.Stats()
	ch <- prometheus.MustNewConstMetric(c.settlements, prometheus.CounterValue, float64(st.Captures), KindCapture)
	ch <- prometheus.MustNewConstMetric(c.settlements, prometheus.CounterValue, float64(st.Refunds), KindRefund)
	ch <- prometheus.MustNewConstMetric(c.duplicates, prometheus.CounterValue, float64(st.Duplicates))
	ch <- prometheus.MustNewConstMetric(c.fsyncs, prometheus.CounterValue, float64(c.ledger.Syncs()))
}
