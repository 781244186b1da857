package prove

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// build compiles the four programs into dir/bin and toxiproxy's server.
func build(ctx context.Context, root, dir string, logf func(string, ...any)) (map[string]string, error) {
	bins := map[string]string{
		"orders":     "./services/orders/cmd/orders",
		"billing":    "./services/billing/cmd/billing",
		"shim":       "./services/reconciler-shim/cmd/shim",
		"reconciler": "./services/reconciler-shim/cmd/reconciler",
		"toxiproxy":  "github.com/Shopify/toxiproxy/v2/cmd/server",
	}
	out := map[string]string{}
	logf("building %s …", strings.Join(slices.Sorted(maps.Keys(bins)), ", "))
	for name, pkg := range bins {
		path := filepath.Join(dir, "bin", name)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", path, pkg)
		cmd.Dir = root
		if name == "toxiproxy" {
			cmd.Dir = filepath.Join(root, "loadtest", "prove") // the module that pins it as a tool
		}
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s: %w\n%s", name, err, b)
		}
		out[name] = path
	}
	return out, nil
}

// Proc is one service running as a real OS process, supervised: when it
// dies (its own crash point, a kill -9 from the harness, a start that failed
// because a server was down) it is started again, until Stop.
type Proc struct {
	Name string
	Port int
	// AdminPort is its operator listener (ADMIN_ADDR): /metrics, /admin/...
	AdminPort int
	bin       string
	env       map[string]string
	log       string
	// arm returns the extra environment of the next start: the crash point
	// the harness arms for it, or nothing.
	arm func() map[string]string
	// scrape lists the counters to follow across restarts (see Counter).
	scrape []string

	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool
	done     chan struct{}
	crashes  int
	lastKill time.Time
	// exits counts the lifetimes that ended neither by SIGKILL (the
	// harness's or an armed crash point's) nor by Stop: the process gave up
	// by itself, which a production-shaped proof counts as a failure.
	exits    int
	lastExit string
	// hangs counts the Stops that SIGTERM did not end within 20s.
	hangs  int
	starts int
	gen    int // lifetimes ended so far
	// per lifetime, the last value scraped of each counter
	closedSums map[string]float64
	current    map[string]float64
}

// Start starts the process and supervises it.
func (p *Proc) Start() error {
	p.mu.Lock()
	if p.closedSums == nil {
		p.closedSums, p.current = map[string]float64{}, map[string]float64{}
	}
	// Each lifetime has its own done channel; the goroutines get it as an
	// argument, so a restart's new channel never races with them.
	done := make(chan struct{})
	p.done = done
	p.mu.Unlock()
	if err := p.spawn(); err != nil {
		return err
	}
	go p.supervise(done)
	if len(p.scrape) > 0 {
		go p.scraper(done)
	}
	return nil
}

func (p *Proc) spawn() error {
	env := maps.Clone(p.env)
	if p.arm != nil {
		maps.Copy(env, p.arm())
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== %s start %s %s=%s %s=%s\n", p.Name, time.Now().UTC().Format(time.RFC3339Nano),
		"CRASH_POINT", env["CRASH_POINT"], "CRASH_AFTER", env["CRASH_AFTER"])
	cmd := exec.Command(p.bin)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	f.Close() // the child holds its own descriptor
	p.mu.Lock()
	p.cmd = cmd
	p.starts++
	p.mu.Unlock()
	return nil
}

func (p *Proc) supervise(done chan struct{}) {
	defer close(done)
	for {
		p.mu.Lock()
		cmd := p.cmd
		p.mu.Unlock()
		err := cmd.Wait()
		p.mu.Lock()
		for k, v := range p.current {
			p.closedSums[k] += v
		}
		p.current = map[string]float64{}
		p.gen++
		var exit *exec.ExitError
		killed := false
		if errors.As(err, &exit) {
			if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				killed = true
			}
		}
		if killed {
			p.crashes++
			p.lastKill = time.Now()
		}
		stopping := p.stopping
		if !killed && !stopping {
			p.exits++
			p.lastExit = fmt.Sprintf("%s: %v", time.Now().UTC().Format(time.RFC3339), err)
		}
		p.mu.Unlock()
		if stopping {
			return
		}
		if !killed {
			// It ended by itself (a server it needs was down at start):
			// start again after a pause, as a process supervisor would.
			time.Sleep(500 * time.Millisecond) //nolint:forbidigo // pacing restarts, not waiting for a condition
		}
		for {
			if err := p.spawn(); err == nil {
				break
			}
			time.Sleep(500 * time.Millisecond) //nolint:forbidigo // pacing restarts
		}
	}
}

// scraper follows the counters in scrape through /metrics every 250ms.
func (p *Proc) scraper(done <-chan struct{}) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		p.mu.Lock()
		gen := p.gen
		p.mu.Unlock()
		m, err := p.Metrics()
		if err != nil {
			continue
		}
		p.mu.Lock()
		if gen != p.gen {
			p.mu.Unlock()
			continue // scraped a lifetime that has ended since
		}
		for _, name := range p.scrape {
			if v, ok := m[name]; ok && v >= p.current[name] {
				p.current[name] = v
			}
		}
		p.mu.Unlock()
	}
}

// Counter is the sum of the counter name over every lifetime of the process
// (as last scraped: increments in the last 250ms before a kill are missed).
func (p *Proc) Counter(name string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closedSums[name] + p.current[name]
}

// Crashes is how many times the process died of SIGKILL.
func (p *Proc) Crashes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.crashes
}

// LastKill is when the process last died of SIGKILL.
func (p *Proc) LastKill() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastKill
}

// Exits is how many times the process ended by itself: not by SIGKILL, not
// by Stop. A service must ride out a broker or database outage in the
// process, so any exit here is a failure of the new proofs.
func (p *Proc) Exits() (n int, last string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exits, p.lastExit
}

// Hangs is how many times SIGTERM did not end the process within 20s (it
// was then killed).
func (p *Proc) Hangs() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hangs
}

// Running reports whether the process is supervised now (started and not
// stopped).
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done != nil && !p.stopping
}

// Kill sends SIGKILL; the supervisor restarts the process.
func (p *Proc) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
	}
}

// Stop ends the process with SIGTERM (SIGKILL after 20s) and stops supervising.
func (p *Proc) Stop() {
	p.mu.Lock()
	if p.done == nil || p.stopping {
		p.mu.Unlock()
		return
	}
	p.stopping = true
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		p.mu.Lock()
		p.hangs++
		p.mu.Unlock()
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart stops the process gracefully and starts it again with env changes.
func (p *Proc) Restart(ctx context.Context, change map[string]string) error {
	p.Stop()
	return p.Resume(ctx, change)
}

// Resume starts a process that Stop ended, with env changes, and waits
// until it is ready.
func (p *Proc) Resume(ctx context.Context, change map[string]string) error {
	p.mu.Lock()
	p.stopping = false
	p.env = maps.Clone(p.env)
	maps.Copy(p.env, change)
	p.mu.Unlock()
	if err := p.Start(); err != nil {
		return err
	}
	return p.WaitReady(ctx, 90*time.Second)
}

// URL is the base URL of the process's HTTP server.
func (p *Proc) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", p.Port) }

// AdminURL is the base URL of the process's operator listener; calls to
// /admin/... there need adminToken.
func (p *Proc) AdminURL() string { return fmt.Sprintf("http://127.0.0.1:%d", p.AdminPort) }

// adminToken is every harness process's ADMIN_TOKEN: they listen on loopback
// only, for the length of a proof.
const adminToken = "onceflow-prove-operator-token"

// WaitReady waits until /readyz answers 200 (or, for the reconciler, /stats).
func (p *Proc) WaitReady(ctx context.Context, timeout time.Duration) error {
	path := "/readyz"
	if p.Name == "reconciler" {
		path = "/stats"
	}
	client := http.Client{Timeout: time.Second}
	err := waitUntil(ctx, timeout, func() bool {
		resp, err := client.Get(p.URL() + path)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if err != nil {
		return fmt.Errorf("%s not ready: %w (log: %s)", p.Name, err, p.log)
	}
	return nil
}

// MetricsURL is where the process serves /metrics: its operator listener.
// Every scrape of the harness goes through here.
func (p *Proc) MetricsURL() string { return p.AdminURL() + "/metrics" }

// Metrics scrapes the process's /metrics now and sums each metric's series
// over their labels.
func (p *Proc) Metrics() (map[string]float64, error) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(p.MetricsURL())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			continue
		}
		out[name] += v
	}
	return out, sc.Err()
}
