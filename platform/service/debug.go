package service

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/lifecycle"
)

// DebugWriteTimeout bounds one answer of the debug listener, and so the
// longest CPU profile or trace it can take (?seconds= must be below it;
// net/http/pprof refuses longer ones).
const DebugWriteTimeout = 10 * time.Minute

// Debug is the opt-in debug listener (DEBUG_ADDR): net/http/pprof under
// /debug/pprof/ and nothing else. It is a listener of its own, not a route
// of the operator one, so that `go tool pprof http://ADDR/debug/pprof/profile`
// works as is (pprof's tools send no bearer token) and a long profile is not
// cut by the operator listener's HTTP_WRITE_TIMEOUT. On loopback it needs no
// token; anywhere else it needs ADMIN_TOKEN, and then every request must
// carry it. A nil *Debug is a listener that is off.
type Debug struct {
	ln      net.Listener
	handler http.Handler
}

// ListenDebug checks addr and listens on it; an empty addr is off and
// returns nil, nil. A non-loopback addr is refused without a token, as
// ADMIN_ADDR is: a profile reveals the program's code paths and costs CPU.
func ListenDebug(addr, token string) (*Debug, error) {
	if addr == "" {
		return nil, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("DEBUG_ADDR %q is not host:port: %w", addr, err)
	}
	loopback := httpserver.IsLoopback(host)
	if !loopback && token == "" {
		return nil, fmt.Errorf("DEBUG_ADDR %s is not a loopback address and ADMIN_TOKEN is empty: "+
			"listen on 127.0.0.1 (the default use), or set ADMIN_TOKEN, which every request must then carry", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on DEBUG_ADDR %s: %w", addr, err)
	}
	var h http.Handler = debugMux()
	if !loopback {
		h = requireToken(token, h)
	}
	return &Debug{ln: ln, handler: h}, nil
}

// Addr is the address the listener is bound to (the real port when
// DEBUG_ADDR asked for port 0), or "" when it is off.
func (d *Debug) Addr() string {
	if d == nil {
		return ""
	}
	return d.ln.Addr().String()
}

// Stages are the lifecycle stages that serve the listener until their
// context ends: one, or none when it is off.
func (d *Debug) Stages(grace time.Duration) []lifecycle.Stage {
	if d == nil {
		return nil
	}
	return []lifecycle.Stage{{Name: "debug http", Run: func(ctx context.Context) error {
		return httpserver.Serve(ctx, d.handler, d.ln, grace, httpserver.Timeouts{WriteTimeout: DebugWriteTimeout})
	}}}
}

// Close releases the listener of a Debug whose stages never ran (the
// program failed before serving).
func (d *Debug) Close() error {
	if d == nil {
		return nil
	}
	return d.ln.Close()
}

// debugMux mounts net/http/pprof's handlers one by one: importing the
// package also registers them on http.DefaultServeMux, which no listener of
// the platform serves.
func debugMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// requireToken answers 401 to a request without "Authorization: Bearer
// <token>", compared in constant time as the operator listener does.
func requireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="onceflow-debug"`)
			http.Error(w, "send Authorization: Bearer <ADMIN_TOKEN>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
