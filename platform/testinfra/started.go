package testinfra

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// WaitRecord waits up to timeout for the program to log a JSON record whose
// "msg" is msg (a program's "… started" line carries the addresses it bound,
// which a test needs before it can reach it) and returns that record.
func (r *Running) WaitRecord(t testing.TB, timeout time.Duration, msg string) map[string]any {
	t.Helper()
	var rec map[string]any
	WaitFor(t, timeout, "the log record "+msg, func() (bool, error) {
		var ok bool
		rec, ok = r.Logs.Record(msg)
		return ok, nil
	})
	return rec
}

// Addr returns the string field key of a log record (an address such as
// "http_addr"), failing the test when the record does not carry it.
func Addr(t testing.TB, rec map[string]any, key string) string {
	t.Helper()
	addr, ok := rec[key].(string)
	if !ok || addr == "" {
		t.Fatalf("log record %v has no %q", rec, key)
	}
	return addr
}

// GetJSON GETs url and decodes its JSON body into v, returning the status
// code; a body that is not JSON fails the test.
func GetJSON(t testing.TB, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: decoding the body: %v", url, err)
	}
	return resp.StatusCode
}

// PostJSON POSTs body as JSON to url and fails the test unless it answers
// want: the services' tests place orders and the like this way.
func PostJSON(t testing.TB, url, body string, want int) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("POST %s: status %d, want %d", url, resp.StatusCode, want)
	}
}
