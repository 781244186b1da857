package httpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/httpserver"
)

func TestAdminListenerNeedsTheBearerToken(t *testing.T) {
	t.Parallel()
	newAdmin := func(token string) *echo.Echo {
		e := httpserver.NewAdmin(httpserver.AdminConfig{
			Logger: slog.New(slog.DiscardHandler), Gatherer: prometheus.NewRegistry(), Token: token, Pprof: true,
		})
		e.POST("/admin/thing", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]bool{"done": true}) })
		return e
	}
	call := func(e *echo.Echo, method, path, auth string) (int, string) {
		req := httptest.NewRequest(method, path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	e := newAdmin("tok-123")
	for _, tt := range []struct {
		method, path, auth string
		want               int
	}{
		{"POST", "/admin/thing", "", 401},
		{"POST", "/admin/thing", "Bearer tok-12", 401},
		{"POST", "/admin/thing", "Bearer tok-1234", 401},
		{"POST", "/admin/thing", "Basic tok-123", 401},
		{"POST", "/admin/thing", "tok-123", 401},
		{"POST", "/admin/thing", "Bearer tok-123", 200},
		{"GET", "/admin/nothing", "", 401}, // no hint of which routes exist
		{"GET", "/debug/pprof/", "", 401},
		{"GET", "/debug/pprof/", "Bearer tok-123", 200},
		{"GET", "/metrics", "", 200},
		{"GET", "/healthz", "", 200},
	} {
		if got, body := call(e, tt.method, tt.path, tt.auth); got != tt.want {
			t.Errorf("%s %s with %q = %d %s, want %d", tt.method, tt.path, tt.auth, got, body, tt.want)
		}
	}
	// No token configured: the operator routes are closed, and say why.
	if got, body := call(newAdmin(""), "POST", "/admin/thing", "Bearer "); got != 401 || !strings.Contains(body, "ADMIN_TOKEN") {
		t.Errorf("without a configured token: %d %s, want 401 naming ADMIN_TOKEN", got, body)
	}
}

func TestCheckAdminAddr(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:9081", "", true},
		{"localhost:9081", "", true},
		{"[::1]:9081", "", true},
		{"127.0.0.2:0", "", true},
		{"0.0.0.0:9081", "", false},
		{":9081", "", false},
		{"[::]:9081", "", false},
		{"10.0.0.5:9081", "", false},
		{"admin.example:9081", "", false},
		{"0.0.0.0:9081", "t", true},
		{"nonsense", "t", false},
	} {
		err := httpserver.CheckAdminAddr(tt.addr, tt.token)
		if (err == nil) != tt.ok {
			t.Errorf("CheckAdminAddr(%q, %q) = %v, want ok=%v", tt.addr, tt.token, err, tt.ok)
		}
	}
}

func TestRequestIDIsEchoedAndInEvery5xxBody(t *testing.T) {
	t.Parallel()
	e := newServer(nil)
	for _, tt := range []struct {
		sent string
		kept bool
	}{
		{"abc-123", true},
		{"", false},
		{"has space", false},
		{"bad\xff", false},
		{strings.Repeat("x", 129), false},
	} {
		req := httptest.NewRequest("GET", "/boom", nil)
		if tt.sent != "" {
			req.Header.Set("X-Request-Id", tt.sent)
		}
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		id := rec.Header().Get("X-Request-Id")
		var body httpserver.ErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if id == "" || body.Error.RequestID != id || !strings.Contains(body.Error.Message, id) {
			t.Fatalf("sent %q: header %q, body %s; want the id in both", tt.sent, id, rec.Body)
		}
		if tt.kept != (id == tt.sent) {
			t.Fatalf("sent %q, got %q back; kept = %v, want %v", tt.sent, id, id == tt.sent, tt.kept)
		}
	}
}

// A client that sends its body one byte a second is cut off by ReadTimeout
// instead of holding the connection and a goroutine for as long as it likes.
func TestSlowBodyIsCutOffByReadTimeout(t *testing.T) {
	t.Parallel()
	handlerErr := make(chan error, 1)
	e := httpserver.New(httpserver.Config{Logger: slog.New(slog.DiscardHandler)})
	e.POST("/slow", func(c echo.Context) error {
		_, err := io.ReadAll(c.Request().Body)
		handlerErr <- err
		return err
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- httpserver.Serve(ctx, e, ln, time.Second, httpserver.Timeouts{ReadTimeout: 800 * time.Millisecond})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cutOff := false
	for i := 0; i < 10; i++ {
		if _, err := conn.Write([]byte{'x'}); err != nil {
			cutOff = true
			break
		}
		select {
		case err := <-handlerErr:
			if err == nil {
				t.Fatal("the handler read the whole body")
			}
			cutOff = true
		case <-time.After(time.Second): // the slow client's pace
		}
		if cutOff {
			break
		}
	}
	if !cutOff {
		t.Fatalf("the connection was still being read after %v", time.Since(start))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("cut off only after %v, want about the ReadTimeout", d)
	}
}

func TestTimeoutsDefaults(t *testing.T) {
	t.Parallel()
	srv := httpserver.Timeouts{}.Server(http.NotFoundHandler())
	d := httpserver.DefaultTimeouts
	if srv.ReadTimeout != d.ReadTimeout || srv.WriteTimeout != d.WriteTimeout || srv.IdleTimeout != d.IdleTimeout ||
		srv.ReadHeaderTimeout != d.ReadHeaderTimeout || srv.MaxHeaderBytes != d.MaxHeaderBytes || srv.ReadTimeout == 0 {
		t.Fatalf("a zero Timeouts built %+v, want the defaults %+v", srv, d)
	}
}

// The standard-library operator handlers share the mapper: an apperr code
// keeps its status, anything else is a 500 with only a request id.
func TestWriteHTTP(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err    error
		status int
		code   string
	}{
		{apperr.Errorf(apperr.Malformed, "bad"), 400, "malformed"},
		{apperr.Errorf(apperr.Unauthorized, "who"), 401, "unauthorized"},
		{apperr.Errorf(apperr.Invalid, "no"), 422, "invalid"},
		{&http.MaxBytesError{Limit: 10}, 413, "too_large"},
		{errors.New("pq: password authentication failed for user postgres at 10.1.2.3"), 500, "internal"},
	} {
		rec := httptest.NewRecorder()
		apperr.WriteHTTP(rec, httptest.NewRequest("GET", "/", nil), slog.New(slog.DiscardHandler), tt.err)
		var body httpserver.ErrorBody
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != tt.status || body.Error.Code != tt.code || strings.Contains(rec.Body.String(), "password") {
			t.Errorf("WriteHTTP(%v) = %d %s, want %d %s and no internal text", tt.err, rec.Code, rec.Body, tt.status, tt.code)
		}
	}
}
