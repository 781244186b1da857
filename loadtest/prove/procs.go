package prove

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/onceflow/onceflow/platform/harness"
)

// build compiles the four programs (harness.Build) into dir/bin, and
// toxiproxy's server.
func build(ctx context.Context, root, dir string, logf func(string, ...any)) (map[string]string, error) {
	logf("building the four programs and toxiproxy …")
	bins, err := harness.Build(ctx, root, filepath.Join(dir, "bin"))
	if err != nil {
		return nil, err
	}
	out := maps.Clone(bins)
	out["toxiproxy"] = filepath.Join(dir, "bin", "toxiproxy")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out["toxiproxy"], "github.com/Shopify/toxiproxy/v2/cmd/server")
	cmd.Dir = filepath.Join(root, "loadtest", "prove") // the module that pins it as a tool
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building toxiproxy: %w\n%s", err, b)
	}
	return out, nil
}

// kills counts the SIGKILLs a process took and remembers when the last one
// landed: a proof's fault count and the start of its recovery time. Proc and
// Debezium each keep one.
type kills struct {
	mu   sync.Mutex
	n    int
	last time.Time
}

func (k *kills) add() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.n++
	k.last = time.Now()
}

func (k *kills) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n
}

func (k *kills) lastAt() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.last
}

// stopGrace is how long a graceful stop waits after SIGTERM before it
// kills and counts a hang.
const stopGrace = 20 * time.Second

// Proc is one service running as a real OS process (a harness.Proc),
// supervised: when it dies (its own crash point, a kill -9 from the
// harness, a start that failed because a server was down) it is started
// again, on the same addresses, until Stop.
type Proc struct {
	Name string
	hp   *harness.Proc
	// arm returns the extra environment of the next start: the crash point
	// the harness arms for it, or nothing.
	arm func() map[string]string
	// armed is the environment arm gave the current lifetime; unspent is
	// set when that lifetime ended by itself (a start that failed because
	// a server was down) and so never reached its crash point: the next
	// start gets the same arming instead of spending another of arm's
	// budget (chaos asks for three kills of the shim; a Postgres fault
	// that failed three starts in a row used to spend all three).
	armed   map[string]string
	unspent bool
	// scrape lists the counters to follow across restarts (see Counter).
	scrape []string

	mu       sync.Mutex
	stopping bool
	done     chan struct{} // closed when the supervisor returns
	crashes  kills
	// exits counts the lifetimes that ended neither by SIGKILL (the
	// harness's or an armed crash point's) nor by Stop: the process gave up
	// by itself, which a production-shaped proof counts as a failure.
	exits    int
	lastExit string
	// hangs counts the Stops that SIGTERM did not end within stopGrace.
	hangs int
	gen   int // lifetimes ended so far
	// per lifetime, the last value scraped of each counter
	closedSums map[string]float64
	current    map[string]float64
}

// Start starts the process (the first time on port 0, then on the
// addresses it bound) and supervises it.
func (p *Proc) Start(ctx context.Context) error {
	p.mu.Lock()
	if p.closedSums == nil {
		p.closedSums, p.current = map[string]float64{}, map[string]float64{}
	}
	// Each supervision has its own done channel; the goroutines get it as
	// an argument, so a restart's new channel never races with them.
	done := make(chan struct{})
	p.done = done
	p.mu.Unlock()
	if err := p.spawn(ctx); err != nil {
		p.mu.Lock()
		p.done = nil // nothing to supervise, nothing for Stop to wait for
		p.mu.Unlock()
		return err
	}
	go p.supervise(done)
	if len(p.scrape) > 0 {
		go p.scraper(done)
	}
	return nil
}

// spawn starts one lifetime with the next arming, or the last one again
// when the lifetime it was given did not use it (unspent).
func (p *Proc) spawn(ctx context.Context) error {
	if p.arm != nil {
		if !p.unspent || p.armed == nil {
			p.armed = p.arm()
		}
		p.unspent = false
		p.hp.SetEnv(p.armed)
	}
	return p.hp.Start(ctx)
}

func (p *Proc) supervise(done chan struct{}) {
	defer close(done)
	for {
		<-p.hp.Done()
		err := p.hp.ExitErr()
		p.mu.Lock()
		for k, v := range p.current {
			p.closedSums[k] += v
		}
		p.current = map[string]float64{}
		p.gen++
		killed := harness.Killed(err)
		if killed {
			p.crashes.add()
		}
		if !killed && !p.stopping {
			p.exits++
			p.lastExit = fmt.Sprintf("%s: %v", time.Now().UTC().Format(time.RFC3339), err)
			p.unspent = true
		}
		stopping := p.stopping
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
			// Holding mu: a Stop either comes first (and no new lifetime
			// starts) or signals the one started here.
			p.mu.Lock()
			if p.stopping {
				p.mu.Unlock()
				return
			}
			err := p.spawn(context.Background())
			p.mu.Unlock()
			if err == nil {
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
func (p *Proc) Crashes() int { return p.crashes.count() }

// LastKill is when the process last died of SIGKILL.
func (p *Proc) LastKill() time.Time { return p.crashes.lastAt() }

// Exits is how many times the process ended by itself: not by SIGKILL, not
// by Stop. A service must ride out a broker or database outage in the
// process, so any exit here is a failure of the new proofs.
func (p *Proc) Exits() (n int, last string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exits, p.lastExit
}

// Hangs is how many times SIGTERM did not end the process within
// stopGrace (it was then killed).
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
func (p *Proc) Kill() { p.hp.Kill() }

// Stop ends the process with SIGTERM (SIGKILL after stopGrace, counted as
// a hang) and stops supervising.
func (p *Proc) Stop() {
	p.mu.Lock()
	if p.done == nil || p.stopping {
		p.mu.Unlock()
		return
	}
	p.stopping = true
	done := p.done
	p.mu.Unlock()
	if err := p.hp.Stop(stopGrace); errors.Is(err, harness.ErrHung) {
		p.mu.Lock()
		p.hangs++
		p.mu.Unlock()
	}
	<-done
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
	p.mu.Unlock()
	p.hp.SetEnv(change)
	if err := p.Start(ctx); err != nil {
		return err
	}
	return p.WaitReady(ctx, 90*time.Second)
}

// env is a variable of the process's environment.
func (p *Proc) env(key string) string { return p.hp.Env(key) }

// URL is the base URL of the process's HTTP server.
func (p *Proc) URL() string { return p.hp.URL() }

// AdminURL is the base URL of the process's operator listener; calls to
// /admin/... there need adminToken.
func (p *Proc) AdminURL() string { return p.hp.AdminURL() }

// adminToken is every harness process's ADMIN_TOKEN: they listen on loopback
// only, for the length of a proof.
const adminToken = "onceflow-prove-operator-token"

// WaitReady waits until /readyz answers 200. A lifetime that ends
// meanwhile (a crash point) is not the end: the supervisor starts another.
func (p *Proc) WaitReady(ctx context.Context, timeout time.Duration) error {
	client := http.Client{Timeout: time.Second}
	err := waitUntil(ctx, timeout, func() bool {
		resp, err := client.Get(p.URL() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if err != nil {
		return fmt.Errorf("%s not ready: %w (log: %s)\n%s", p.Name, err, p.hp.LogPath(), p.hp.Tail(20))
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
	return harness.SumMetrics(resp.Body, nil)
}
