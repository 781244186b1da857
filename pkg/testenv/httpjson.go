package testenv

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// CallJSON sends an HTTP request with body (none when empty) to url and
// returns the JSON object the response carries, failing the test when the
// request fails or the status is not wantStatus (the body is in the
// message). Operator and API tests use it to walk through their endpoints.
func CallJSON(t testing.TB, method, url, body string, wantStatus int) map[string]any {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out) // an error body may not be JSON; the status says it all
	if resp.StatusCode != wantStatus {
		t.Fatalf("%s %s: status %d, want %d: %v", method, url, resp.StatusCode, wantStatus, out)
	}
	return out
}
