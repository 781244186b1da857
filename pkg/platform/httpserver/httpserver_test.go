package httpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/platform/apperr"
	"github.com/onceflow/onceflow/pkg/platform/httpserver"
)

func newServer(checks map[string]httpserver.Check) *echo.Echo {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "test_things_total", Help: "Things."}))
	e := httpserver.New(httpserver.Config{
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Gatherer:  reg,
		Checks:    checks,
		BodyLimit: "1K",
	})
	e.POST("/echo", func(c echo.Context) error {
		var v struct {
			Name string `json:"name"`
		}
		if err := httpserver.DecodeJSON(c.Request().Body, &v); err != nil {
			return err
		}
		if v.Name == "" {
			return apperr.Errorf(apperr.Invalid, "name is required")
		}
		return c.JSON(http.StatusOK, v)
	})
	e.GET("/boom", func(echo.Context) error { return errors.New("secret detail") })
	return e
}

func serve(e *echo.Echo, method, path, body string) (int, httpserver.ErrorBody, string) {
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	var eb httpserver.ErrorBody
	_ = json.Unmarshal(rec.Body.Bytes(), &eb)
	return rec.Code, eb, rec.Body.String()
}

func TestErrorsBecomeJSONWithTheRightStatus(t *testing.T) {
	e := newServer(nil)
	tests := []struct {
		name, method, path, body string
		status                   int
		code, message            string
	}{
		{"ok", "POST", "/echo", `{"name":"a"}`, 200, "", ""},
		{"malformed", "POST", "/echo", `{"name":`, 400, "malformed", "not valid JSON"},
		{"empty", "POST", "/echo", ``, 400, "malformed", "empty"},
		{"unknown field", "POST", "/echo", `{"name":"a","x":1}`, 400, "malformed", `unknown field "x"`},
		{"two objects", "POST", "/echo", `{"name":"a"}{}`, 400, "malformed", "after the JSON object"},
		{"invalid", "POST", "/echo", `{"name":""}`, 422, "invalid", "name is required"},
		{"too large", "POST", "/echo", `{"name":"` + strings.Repeat("x", 2048) + `"}`, 413, "too_large", "larger than the limit of 1KB"},
		{"no route", "GET", "/nope", ``, 404, "http_404", "Not Found"},
		{"internal", "GET", "/boom", ``, 500, "internal", "see the service log"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body, raw := serve(e, tt.method, tt.path, tt.body)
			if status != tt.status || body.Error.Code != tt.code || !strings.Contains(body.Error.Message, tt.message) {
				t.Fatalf("got %d %s, want %d %s %q", status, raw, tt.status, tt.code, tt.message)
			}
			if strings.Contains(raw, "secret detail") {
				t.Fatal("an internal error's detail leaked to the client")
			}
		})
	}
}

func TestReadyzReportsEachCheck(t *testing.T) {
	e := newServer(map[string]httpserver.Check{
		"postgres": func(context.Context) error { return nil },
		"kafka":    func(context.Context) error { return errors.New("connection refused") },
	})
	status, _, raw := serve(e, "GET", "/readyz", "")
	if status != http.StatusServiceUnavailable || !strings.Contains(raw, `"kafka":"connection refused"`) || !strings.Contains(raw, `"postgres":"ok"`) {
		t.Fatalf("readyz: %d %s", status, raw)
	}
	if status, _, _ := serve(e, "GET", "/healthz", ""); status != http.StatusOK {
		t.Fatalf("healthz: %d", status)
	}
	if status, _, raw := serve(e, "GET", "/metrics", ""); status != http.StatusOK || !strings.Contains(raw, "test_things_total 0") {
		t.Fatalf("metrics: %d", status)
	}
}
