package apperr_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/platform/apperr"
)

func TestQuoteCutsLongInput(t *testing.T) {
	t.Parallel()
	if got := apperr.Quote("EUR"); got != `"EUR"` {
		t.Fatalf("Quote(EUR) = %s", got)
	}
	long := strings.Repeat("é", 1000) // 2 bytes each: the cut must not split one
	got := apperr.Quote(long)
	if len(got) > apperr.MaxQuote+40 || !strings.HasSuffix(got, "(2000 bytes)") || strings.Contains(got, `\x`) {
		t.Fatalf("Quote of 2000 bytes = %s", got)
	}
}

func TestCheckText(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		s  string
		ok bool
	}{{"", true}, {"key-1 ü", true}, {"k\x00", false}, {"k\xff", false}, {"\xc3", false}} {
		err := apperr.CheckText("the value", tt.s)
		if (err == nil) != tt.ok {
			t.Errorf("CheckText(%q) = %v, want ok=%v", tt.s, err, tt.ok)
		}
		if ae, isApp := apperr.As(err); err != nil && (!isApp || ae.Code != apperr.Malformed) {
			t.Errorf("CheckText(%q) = %v, want Malformed", tt.s, err)
		}
	}
}

// A store's unavailable error wraps the driver's cause: the client gets 503,
// a message that says to retry, Retry-After and the request id; the cause
// (host, port, SQL) goes to the log only. Any other error is a bare 500.
func TestWriteHTTPKeepsCausesInTheLog(t *testing.T) {
	t.Parallel()
	unavailable := apperr.Errorf(apperr.Unavailable, "the orders database is unavailable; retry later")
	cause := errors.New("dial tcp 10.1.2.3:5432: connect: connection refused")
	for _, tt := range []struct {
		name       string
		err        error
		status     int
		code, want string
	}{
		{"unavailable", fmt.Errorf("reading order: %w: %w", unavailable, cause), http.StatusServiceUnavailable, "unavailable", "retry later"},
		{"internal", fmt.Errorf("reading order: %w", cause), http.StatusInternalServerError, "internal", "internal error"},
		{"not found", apperr.Errorf(apperr.NotFound, "order 1 does not exist"), http.StatusNotFound, "not_found", "does not exist"},
		{"conflict", apperr.Errorf(apperr.Conflict, "key used"), http.StatusConflict, "conflict", "key used"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var log bytes.Buffer
			logger := slog.New(slog.NewJSONHandler(&log, nil))
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, "/orders/1", nil)
			req.Header.Set(apperr.RequestIDHeader, "req-7")
			apperr.WriteHTTP(rec, req, logger, tt.err)
			var body apperr.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if rec.Code != tt.status || body.Error.Code != tt.code || !strings.Contains(body.Error.Message, tt.want) {
				t.Fatalf("got %d %+v, want %d %s mentioning %q", rec.Code, body.Error, tt.status, tt.code, tt.want)
			}
			if strings.Contains(rec.Body.String(), "10.1.2.3") || strings.Contains(rec.Body.String(), "dial tcp") {
				t.Fatalf("the cause leaked to the client: %s", rec.Body)
			}
			if tt.status < 500 {
				return
			}
			if body.Error.RequestID != "req-7" || !strings.Contains(log.String(), "10.1.2.3") || !strings.Contains(log.String(), "req-7") {
				t.Fatalf("a %d needs the request id in the body (%q) and the cause under it in the log:\n%s", tt.status, body.Error.RequestID, log.String())
			}
			if got := rec.Header().Get("Retry-After"); (tt.status == http.StatusServiceUnavailable) != (got != "") {
				t.Fatalf("Retry-After = %q on a %d", got, tt.status)
			}
		})
	}
}
