package rig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/onceflow/onceflow/platform/harness"
)

// debugEnv gives program name a debug listener (DEBUG_ADDR) on a free
// loopback port and records its URL in p.DebugURLs. It also sets PPROF, so
// that binaries built before DEBUG_ADDR existed (a BASE revision) still
// serve pprof, on their operator listener behind the token.
func (p *Platform) debugEnv(name string) ([]string, error) {
	addrs, err := harness.FreeAddrs(1)
	if err != nil {
		return nil, err
	}
	addr := addrs[0]
	if p.DebugURLs == nil {
		p.DebugURLs = map[string]string{}
	}
	p.DebugURLs[name] = "http://" + addr
	return []string{"DEBUG_ADDR=" + addr, "PPROF=true"}, nil
}

// adminURL is program name's operator listener.
func (p *Platform) adminURL(name string) string {
	return map[string]string{"orders": p.OrdersAdminURL, "billing": p.BillingAdminURL,
		"shim": p.ShimAdminURL, "reconciler": p.ReconcilerAdminURL}[name]
}

// Profile writes a CPU profile of program name over d to path: from its
// debug listener, or, for a binary without one, from pprof on its operator
// listener.
func (p *Platform) Profile(ctx context.Context, name string, d time.Duration, path string) error {
	if err := p.pprof(ctx, name, "profile", d, path); err != nil {
		return fmt.Errorf("profiling %s: %v", name, err)
	}
	return nil
}

// Trace writes an execution trace of program name over d to path (go tool
// trace; `go tool trace -pprof=sync|net|sched path` says where goroutines
// blocked), from the same listeners as Profile.
func (p *Platform) Trace(ctx context.Context, name string, d time.Duration, path string) error {
	if err := p.pprof(ctx, name, "trace", d, path); err != nil {
		return fmt.Errorf("tracing %s: %v", name, err)
	}
	return nil
}

// pprof fetches /debug/pprof/<kind>?seconds=… of program name into path,
// from its debug listener, else from its operator listener with the token;
// the error lists each listener's.
func (p *Platform) pprof(ctx context.Context, name, kind string, d time.Duration, path string) error {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	var errs []error
	for _, src := range []struct{ url, token string }{
		{p.DebugURLs[name], ""}, {p.adminURL(name), p.AdminToken},
	} {
		if src.url == "" {
			continue
		}
		err := fetchProfile(ctx, fmt.Sprintf("%s/debug/pprof/%s?seconds=%d", src.url, kind, secs), src.token, path)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return errors.New("no debug or operator listener")
	}
	return errors.Join(errs...)
}

func fetchProfile(ctx context.Context, url, token, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("reading %s: %w", url, err)
	}
	return f.Close()
}

// PIDs returns the programs' pids by name.
func (p *Platform) PIDs() map[string]int {
	out := map[string]int{}
	for _, pr := range p.procs {
		out[pr.Name()] = pr.Pid()
	}
	return out
}
