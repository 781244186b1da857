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

	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/httpserver"
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
		{"no route", "GET", "/nope", ``, 404, "no_route", `no route for GET "/nope"`},
		{"wrong method", "DELETE", "/echo", ``, 405, "method_not_allowed", `DELETE is not allowed on "/echo"`},
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

// The error codes are one vocabulary: apperr's, whoever answers (a handler,
// echo's router, the body limit, the bearer check); never "http_404".
func TestEveryErrorCodeIsApperrs(t *testing.T) {
	known := map[string]bool{}
	for _, c := range []apperr.Code{apperr.Malformed, apperr.Invalid, apperr.NotFound, apperr.Conflict, apperr.TooLarge,
		apperr.Unavailable, apperr.Unauthorized, apperr.NoRoute, apperr.MethodNotAllowed, apperr.UnsupportedMediaType, "internal"} {
		known[string(c)] = true
	}
	e := newServer(nil)
	for _, r := range [][2]string{{"GET", "/nope"}, {"DELETE", "/echo"}, {"POST", "/echo"}, {"GET", "/boom"}, {"PUT", "/healthz"}} {
		status, body, raw := serve(e, r[0], r[1], "")
		if status < 400 || !known[body.Error.Code] {
			t.Errorf("%s %s: %d %s, want an apperr code", r[0], r[1], status, raw)
		}
	}
}

// Error bodies are readable as they are: "<ADMIN_TOKEN>", not
// "\u003cADMIN_TOKEN\u003e".
func TestErrorBodiesAreNotHTMLEscaped(t *testing.T) {
	rec := httptest.NewRecorder()
	apperr.WriteHTTP(rec, httptest.NewRequest("GET", "/", nil), slog.New(slog.NewTextHandler(io.Discard, nil)),
		apperr.Errorf(apperr.Unauthorized, "send Authorization: Bearer <ADMIN_TOKEN> & retry"))
	if body := rec.Body.String(); !strings.Contains(body, "Bearer <ADMIN_TOKEN> & retry") {
		t.Fatalf("401 body = %s, want the message as written", body)
	}
}
