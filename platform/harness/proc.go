package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/platform/logging"
)

// ListeningMsg is the msg of the JSON log record a program writes once both
// its listeners are bound, with their addresses under "http_addr" and
// "admin_addr" (logging.Listening writes it, whatever LOG_LEVEL says).
const ListeningMsg = logging.ListeningMsg

// ErrHung is what Stop returns when SIGTERM did not end the program within
// the grace and it had to be killed.
var ErrHung = errors.New("did not stop after SIGTERM")

// Config says how to run one program.
type Config struct {
	// Spec is the program's contract: Start refuses to run it without its
	// required variables. Zero for a program that is not the platform's
	// (then Name is required).
	Spec Spec
	// Name names the program in errors; default Spec.Name.
	Name string
	// Bin is the binary's path.
	Bin string
	// Args are its arguments.
	Args []string
	// Env is its whole environment, besides PATH: nothing leaks in from
	// the caller's (a developer's DATABASE_URL must not reach a test's
	// program).
	Env map[string]string
	// LogPath receives the program's stdout and stderr, appended to, with
	// a line marking each start. Required.
	LogPath string
	// PrePickPorts is for binaries of older revisions that do not log
	// ListeningMsg: Start does not wait for it and takes the ports it
	// picked for granted (racy: a port another picker took between the
	// pick and the bind shows only as an exit). Never use it for binaries
	// built from this tree. Either way, unless Env gives HTTP_ADDR or
	// ADMIN_ADDR, Proc picks both ports (FreePorts) and keeps them for
	// every lifetime.
	PrePickPorts bool
	// NoAddrs is for a program that has neither HTTP_ADDR nor ADMIN_ADDR
	// (a tool, Prometheus): Start only spawns it.
	NoAddrs bool
	// ListenTimeout bounds how long Start waits for ListeningMsg (which a
	// program logs after connecting and migrating). Default 60s.
	ListenTimeout time.Duration
}

// Proc is one program run as an OS process, over any number of lifetimes:
// Start begins one, an exit (its own, Kill, Stop) ends it, and Start may
// begin the next. Its addresses are the first lifetime's for all of them,
// so clients keep their URLs across restarts.
type Proc struct {
	cfg  Config
	name string

	mu        sync.Mutex
	env       map[string]string
	httpAddr  string
	adminAddr string
	picked    bool // HTTP_ADDR and ADMIN_ADDR are Proc's picks
	cmd       *exec.Cmd
	done      chan struct{} // closed when the current lifetime ended
	exitErr   error
	logOffset int64 // where the current lifetime's log begins
}

// New validates cfg and returns a Proc that has not started.
func New(cfg Config) (*Proc, error) {
	name := cfg.Name
	if name == "" {
		name = cfg.Spec.Name
	}
	if name == "" || cfg.Bin == "" || cfg.LogPath == "" {
		return nil, fmt.Errorf("harness: a program needs a name, a binary and a log path (%q, %q, %q)", name, cfg.Bin, cfg.LogPath)
	}
	if cfg.ListenTimeout == 0 {
		cfg.ListenTimeout = 60 * time.Second
	}
	p := &Proc{cfg: cfg, name: name, env: maps.Clone(cfg.Env)}
	if p.env == nil {
		p.env = map[string]string{}
	}
	if !cfg.NoAddrs && p.env["HTTP_ADDR"] == "" && p.env["ADMIN_ADDR"] == "" {
		// Ports that stay the program's across restarts (a port-0 bind
		// would get an ephemeral one, which a client socket may take
		// while the program is down): see FreePorts.
		if err := p.pickAddrs(); err != nil {
			return nil, err
		}
	}
	if !cfg.NoAddrs {
		for _, k := range []string{"HTTP_ADDR", "ADMIN_ADDR"} {
			if p.env[k] == "" {
				p.env[k] = "127.0.0.1:0"
			}
		}
	}
	if missing := cfg.Spec.Missing(p.env); len(missing) > 0 {
		return nil, fmt.Errorf("harness: %s needs %s", name, strings.Join(missing, ", "))
	}
	return p, nil
}

// Start is New, then Proc.Start.
func Start(ctx context.Context, cfg Config) (*Proc, error) {
	p, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return p, p.Start(ctx)
}

// pickAddrs gives the program two ports of its own (HTTP_ADDR, ADMIN_ADDR).
func (p *Proc) pickAddrs() error {
	addrs, err := freeStableAddrs(2)
	if err != nil {
		return err
	}
	p.picked = true
	p.env["HTTP_ADDR"], p.env["ADMIN_ADDR"] = addrs[0], addrs[1]
	return nil
}

// errPortTaken is a first lifetime that could not bind a port Proc picked
// for it (another picker took it between the pick and the bind).
var errPortTaken = errors.New("a picked port was taken")

// Start begins a lifetime and, on the first one, returns once the program
// logged the addresses it bound (but for PrePickPorts, whose binaries do
// not log them); if it could not bind the ports Proc picked, it picks
// others and starts again, up to three times. It does not wait for
// readiness (WaitReady). A lifetime that is still running is an error.
func (p *Proc) Start(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := p.start(ctx)
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			return err
		}
		p.mu.Lock()
		err = p.pickAddrs()
		p.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

func (p *Proc) start(ctx context.Context) error {
	p.mu.Lock()
	if p.done != nil && !p.exited() {
		p.mu.Unlock()
		return fmt.Errorf("harness: %s is running", p.name)
	}
	env := maps.Clone(p.env)
	if p.httpAddr != "" {
		// Later lifetimes keep the first one's addresses.
		env["HTTP_ADDR"], env["ADMIN_ADDR"] = p.httpAddr, p.adminAddr
	}
	p.mu.Unlock()

	f, err := os.OpenFile(p.cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening %s's log: %w", p.name, err)
	}
	defer f.Close() // the child holds its own descriptor
	offset, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("opening %s's log: %w", p.name, err)
	}
	fmt.Fprintf(f, "=== %s start %s CRASH_POINT=%s CRASH_AFTER=%s\n", p.name, time.Now().UTC().Format(time.RFC3339Nano),
		env["CRASH_POINT"], env["CRASH_AFTER"])
	cmd := exec.Command(p.cfg.Bin, p.cfg.Args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a Ctrl-C to the caller reaches the caller,
	// which then stops its programs in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.exitErr, p.logOffset = cmd, done, nil, offset
	needAddrs := !p.cfg.NoAddrs && p.httpAddr == ""
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(done)
	}()
	if !needAddrs {
		return nil
	}
	if addr, err := net.ResolveTCPAddr("tcp", env["HTTP_ADDR"]); err == nil && addr.Port != 0 && (p.cfg.PrePickPorts || !p.picked) {
		p.mu.Lock() // the caller's ports, or an older binary's: nothing to read
		p.httpAddr, p.adminAddr = env["HTTP_ADDR"], env["ADMIN_ADDR"]
		p.mu.Unlock()
		return nil
	}
	if err := p.readAddrs(ctx, offset, done); err != nil {
		// Nobody can reach or stop a program whose addresses are unknown.
		_ = cmd.Process.Kill()
		<-done
		if p.picked && strings.Contains(p.Tail(20), "address already in use") {
			return fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return err
	}
	return nil
}

// readAddrs waits for ListeningMsg in the log from offset on.
func (p *Proc) readAddrs(ctx context.Context, offset int64, done <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ListenTimeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if h, a, ok := listening(p.cfg.LogPath, offset); ok {
			p.mu.Lock()
			p.httpAddr, p.adminAddr = h, a
			p.mu.Unlock()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited before it listened (%v):\n%s", p.name, p.ExitErr(), p.Tail(20))
		case <-ctx.Done():
			return fmt.Errorf("%s did not log %q within %s: %w\n%s", p.name, ListeningMsg, p.cfg.ListenTimeout, ctx.Err(), p.Tail(20))
		case <-t.C:
		}
	}
}

// listening finds the ListeningMsg record in the log at path from offset.
func listening(path string, offset int64) (httpAddr, adminAddr string, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", false
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return "", "", false
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var rec struct {
			Msg       string `json:"msg"`
			HTTPAddr  string `json:"http_addr"`
			AdminAddr string `json:"admin_addr"`
		}
		if json.Unmarshal(line, &rec) == nil && rec.Msg == ListeningMsg && rec.HTTPAddr != "" && rec.AdminAddr != "" {
			return rec.HTTPAddr, rec.AdminAddr, true
		}
	}
	return "", "", false
}

// exited reports whether the current lifetime ended; p.mu is held.
func (p *Proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Name is the program's name.
func (p *Proc) Name() string { return p.name }

// locked reads p's state under its lock.
func locked[T any](p *Proc, read func() T) T {
	p.mu.Lock()
	defer p.mu.Unlock()
	return read()
}

// HTTPAddr is the public listener's address (host:port).
func (p *Proc) HTTPAddr() string { return locked(p, func() string { return p.httpAddr }) }

// AdminAddr is the operator listener's address (host:port).
func (p *Proc) AdminAddr() string { return locked(p, func() string { return p.adminAddr }) }

// URL is the public listener's base URL.
func (p *Proc) URL() string { return "http://" + p.HTTPAddr() }

// AdminURL is the operator listener's base URL.
func (p *Proc) AdminURL() string { return "http://" + p.AdminAddr() }

// Env returns the value of an environment variable of the next lifetime.
func (p *Proc) Env(key string) string { return locked(p, func() string { return p.env[key] }) }

// SetEnv changes the environment of the next lifetimes; "" removes a
// variable. The addresses cannot change.
func (p *Proc) SetEnv(change map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, v := range change {
		if v == "" {
			delete(p.env, k)
		} else {
			p.env[k] = v
		}
	}
}

// Pid is the current lifetime's process id (0 before the first start).
func (p *Proc) Pid() int {
	return locked(p, func() int {
		if p.cmd == nil || p.cmd.Process == nil {
			return 0
		}
		return p.cmd.Process.Pid
	})
}

// Done is closed when the current lifetime ends (nil before the first
// start). Take it before waiting: a Start makes a new one.
func (p *Proc) Done() <-chan struct{} { return locked(p, func() <-chan struct{} { return p.done }) }

// ExitErr is how the last lifetime ended (nil: exit status 0, or still
// running).
func (p *Proc) ExitErr() error { return locked(p, func() error { return p.exitErr }) }

// Running reports whether a lifetime is running now.
func (p *Proc) Running() bool { return locked(p, func() bool { return p.done != nil && !p.exited() }) }

// Killed reports whether err (an ExitErr) is a death by SIGKILL: a crash
// point's, or Kill's.
func Killed(err error) bool {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	return false
}

// Kill sends SIGKILL to the current lifetime, if one is running.
func (p *Proc) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil && !p.exited() {
		_ = p.cmd.Process.Kill()
	}
}

// Stop ends the current lifetime as an orchestrator does: SIGTERM, then
// SIGKILL after grace. It returns ErrHung (wrapped) when SIGTERM did not
// end it in time, the exit error when it ended badly, and nil when it
// exited 0 or was not running.
func (p *Proc) Stop(grace time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil // ended before: its exit is for whoever watched it
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		if err := p.ExitErr(); err != nil {
			return fmt.Errorf("%s exited after SIGTERM: %w", p.name, err)
		}
		return nil
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s %w within %s; killed", p.name, ErrHung, grace)
	}
}

// Restart stops the program (Stop with grace), applies change to its
// environment and starts it again on the same addresses.
func (p *Proc) Restart(ctx context.Context, grace time.Duration, change map[string]string) error {
	stopErr := p.Stop(grace)
	p.SetEnv(change)
	if err := p.Start(ctx); err != nil {
		return errors.Join(stopErr, err)
	}
	return stopErr
}

// WaitReady polls path (such as "/readyz") on the public listener until it
// answers 200, the lifetime ends, ctx ends or timeout passes.
func (p *Proc) WaitReady(ctx context.Context, path string, timeout time.Duration) error {
	return p.waitOK(ctx, p.URL()+path, timeout)
}

// WaitAdminReady is WaitReady on the operator listener.
func (p *Proc) WaitAdminReady(ctx context.Context, path string, timeout time.Duration) error {
	return p.waitOK(ctx, p.AdminURL()+path, timeout)
}

func (p *Proc) waitOK(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := p.Done()
	client := http.Client{Timeout: 2 * time.Second}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited before %s answered 200 (%v); its log (%s) ends:\n%s", p.name, url, p.ExitErr(), p.cfg.LogPath, p.Tail(20))
		case <-ctx.Done():
			return fmt.Errorf("%s: %s did not answer 200 within %s (%w); its log (%s) ends:\n%s", p.name, url, timeout, ctx.Err(), p.cfg.LogPath, p.Tail(20))
		case <-t.C:
		}
	}
}

// LogPath is the program's log file.
func (p *Proc) LogPath() string { return p.cfg.LogPath }

// Tail returns the last n lines of the program's log, for failure messages.
func (p *Proc) Tail(n int) string { return Tail(p.cfg.LogPath, n) }

// Tail returns the last n lines of the file at path ("" if unreadable).
func Tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// FreeAddrs returns n loopback addresses whose ports nobody listens on now,
// all different. Racy by nature (the port is free when asked, not when
// used), and ephemeral: a port that must stay the same across a restart
// comes from FreePorts instead.
func FreeAddrs(n int) ([]string, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	out := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("picking a free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// GetJSON GETs url and decodes its JSON answer into v. A status other than
// 200 is an error that quotes the start of the body (Prometheus, for one,
// says there why it refused a query).
func GetJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: decoding: %w", url, err)
	}
	return nil
}

// RepoRoot returns the repository root: the nearest directory at or above
// the working directory (a test's is its package's) that holds go.work.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work at or above the working directory")
		}
		dir = parent
	}
}

// Root is RepoRoot for a test: it fails t when there is no root.
func Root(t testing.TB) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
