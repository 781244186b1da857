package httpserver_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// Every answered request is counted by route template (never the raw path),
// method and status class, and timed by route; probes and scrapes are not;
// a traced request's latency carries its trace id as an exemplar, which the
// operator listener's /metrics serves to a scraper asking for OpenMetrics.
func TestREDMetricsByRouteTemplateWithTraceExemplars(t *testing.T) {
	spans := testinfra.RecordSpans(t)
	reg := prometheus.NewRegistry()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	e := httpserver.New(httpserver.Config{Logger: logger, Registerer: reg})
	e.GET("/orders/:id", func(c echo.Context) error {
		if c.Param("id") == "missing" {
			return apperr.Errorf(apperr.NotFound, "no order")
		}
		return c.JSON(http.StatusOK, map[string]string{"id": c.Param("id")})
	})
	e.GET("/panic", func(echo.Context) error { panic("boom") })
	do := func(method, path, traceparent string) {
		req := httptest.NewRequest(method, path, nil)
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		e.ServeHTTP(httptest.NewRecorder(), req)
	}
	do("GET", "/orders/1", testinfra.CallerTraceparent)
	do("GET", "/orders/2", "")
	do("GET", "/orders/missing", "")
	do("GET", "/panic", "")
	do("GET", "/no/such/route/7", "")
	do("GET", "/healthz", "")
	do("GET", "/readyz", "")

	want := `
# HELP http_requests_total HTTP requests answered, by route template, method and status class (2xx, 3xx, 4xx, 5xx).
# TYPE http_requests_total counter
http_requests_total{method="GET",route="/orders/:id",status_class="2xx"} 2
http_requests_total{method="GET",route="/orders/:id",status_class="4xx"} 1
http_requests_total{method="GET",route="/panic",status_class="5xx"} 1
http_requests_total{method="GET",route="unmatched",status_class="4xx"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "http_requests_total"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var orders *dto.Histogram
	for _, mf := range mfs {
		if mf.GetName() != "http_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "route" && l.GetValue() == "/orders/:id" {
					orders = m.GetHistogram()
				}
			}
		}
	}
	if orders == nil || orders.GetSampleCount() != 3 {
		t.Fatalf("http_request_duration_seconds for /orders/:id = %v, want 3 observations", orders)
	}
	var exemplars []string
	for _, b := range orders.GetBucket() {
		if ex := b.GetExemplar(); ex != nil {
			for _, l := range ex.GetLabel() {
				exemplars = append(exemplars, l.GetName()+"="+l.GetValue())
			}
		}
	}
	// Each bucket keeps the latest exemplar; every one names a request's
	// own server span.
	traced := map[string]bool{}
	for _, sp := range spans.Ended() {
		traced["trace_id="+sp.SpanContext().TraceID().String()] = true
	}
	if len(exemplars) == 0 {
		t.Fatal("no exemplar on http_request_duration_seconds with tracing on")
	}
	for _, ex := range exemplars {
		if !traced[ex] {
			t.Fatalf("exemplar %s is not the trace of a request served (%v)", ex, traced)
		}
	}
	// The operator listener serves them in OpenMetrics, exemplars included.
	admin := httpserver.NewAdmin(httpserver.AdminConfig{Logger: logger, Gatherer: reg, Token: "t"})
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	rec := httptest.NewRecorder()
	admin.ServeHTTP(rec, req)
	if body := rec.Body.String(); !strings.Contains(body, `http_request_duration_seconds_bucket{method="GET",route="/orders/:id",le=`) ||
		!strings.Contains(body, `# {trace_id="`) {
		t.Fatalf("/metrics in OpenMetrics has no exemplar with the trace id:\n%s", body)
	}
}
