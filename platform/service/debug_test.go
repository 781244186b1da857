package service

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestDebugListenerIsOffByDefault(t *testing.T) {
	t.Parallel()
	d, err := ListenDebug("", "")
	if err != nil || d != nil {
		t.Fatalf("ListenDebug(\"\") = %v, %v; want off (nil, nil)", d, err)
	}
	if d.Addr() != "" || len(d.Stages(time.Second)) != 0 || d.Close() != nil {
		t.Fatal("an off listener has an address, stages or a Close error")
	}
}

func TestDebugListenerRefusesANonLoopbackAddressWithoutAToken(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:6060", "no-port"} {
		if d, err := ListenDebug(addr, ""); err == nil {
			d.Close()
			t.Errorf("ListenDebug(%q, no token) started", addr)
		}
	}
}

// serve runs d's stages until the test ends.
func serve(t *testing.T, d *Debug) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = d.Stages(time.Second)[0].Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func getDebug(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestDebugListenerServesPprofOnLoopbackWithoutAToken(t *testing.T) {
	t.Parallel()
	d, err := ListenDebug("127.0.0.1:0", "tok")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, d)
	base := "http://" + d.Addr()
	if code, body := getDebug(t, base+"/debug/pprof/", ""); code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("GET /debug/pprof/ = %d %.200s; want the index", code, body)
	}
	// A one-second CPU profile: the write timeout must not cut it.
	if code, body := getDebug(t, base+"/debug/pprof/profile?seconds=1", ""); code != 200 || len(body) == 0 {
		t.Fatalf("GET /debug/pprof/profile = %d %.200s", code, body)
	}
	if code, _ := getDebug(t, base+"/metrics", ""); code != 404 {
		t.Fatalf("GET /metrics on the debug listener = %d, want 404: it serves pprof only", code)
	}
}

func TestDebugListenerOffLoopbackRequiresTheToken(t *testing.T) {
	t.Parallel()
	// 0.0.0.0 is not loopback; the test still reaches it over 127.0.0.1.
	d, err := ListenDebug("0.0.0.0:0", "tok-123")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, d)
	_, port, err := net.SplitHostPort(d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + port + "/debug/pprof/cmdline"
	for token, want := range map[string]int{"": 401, "wrong": 401, "tok-123": 200} {
		if code, _ := getDebug(t, url, token); code != want {
			t.Errorf("token %q: %d, want %d", token, code, want)
		}
	}
}
