package rig

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
)

// program is one of the platform's binaries; they start in this order, so
// each one's downstream is up before it, and stop in reverse.
type program struct{ name, pkg string }

var programs = []program{
	{"reconciler", "./services/reconciler-shim/cmd/reconciler"},
	{"shim", "./services/reconciler-shim/cmd/shim"},
	{"billing", "./services/billing/cmd/billing"},
	{"orders", "./services/orders/cmd/orders"},
}

// Build compiles the four programs from the repository at root into dir.
func Build(ctx context.Context, root, dir string) error {
	for _, p := range programs {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, p.name), p.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %w\n%s", p.name, err, out)
		}
	}
	return nil
}

// Config says where the programs are and what to give them.
type Config struct {
	// BinDir holds the programs Build wrote.
	BinDir string
	// WorkDir receives each program's log (<name>.log) and the
	// reconciler's ledger.
	WorkDir string
	// PostgresURL is the server's maintenance database; Start creates the
	// three service databases next to it.
	PostgresURL string
	// Brokers are the Kafka bootstrap brokers.
	Brokers []string
	// Name prefixes the databases and topics (lower case, digits and _).
	Name string
	// Partitions of the two event topics; default 6, as the dev stack.
	Partitions int
	// DatabaseSettings are set on each service database before its program
	// starts (ALTER DATABASE … SET), e.g. "synchronous_commit = off": a knob
	// scoped to this platform, leaving the shared server's config alone.
	DatabaseSettings []string
	// DatabaseParams are appended to the programs' DATABASE_URL query, e.g.
	// "pool_max_conns=16" (pgxpool reads it; the default pool is
	// max(4, cores) connections).
	DatabaseParams string
	// Env adds environment variables per program, e.g.
	// {"orders": {"PUBLISH_MODE=naive"}}.
	Env map[string][]string
	// Logf reports progress; nil is silent.
	Logf func(format string, args ...any)
}

// Platform is a running platform.
type Platform struct {
	OrdersURL, BillingURL, ShimURL, ReconcilerURL string
	// The operator listeners (ADMIN_ADDR): /metrics, /admin/... with AdminToken.
	OrdersAdminURL, BillingAdminURL, ShimAdminURL, ReconcilerAdminURL string
	// AdminToken is the programs' ADMIN_TOKEN, random per platform.
	AdminToken string
	// DebugURLs are the programs' debug listeners (DEBUG_ADDR, pprof), by name.
	DebugURLs map[string]string

	OrdersDB, BillingDB, ShimDB string
	OrdersTopic, BillingTopic   string
	Brokers                     []string

	cfg    Config
	procs  []proc
	dbs    []string
	topics []string
}

// proc is a started program; exited closes when it has exited.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start creates the databases and topics, starts the four programs on free
// ports and returns once each answers /readyz. On an error it takes down
// what it started.
func Start(ctx context.Context, cfg Config) (p *Platform, err error) {
	if cfg.Partitions == 0 {
		cfg.Partitions = 6
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	p = &Platform{cfg: cfg, Brokers: cfg.Brokers,
		OrdersTopic: cfg.Name + ".orders.events", BillingTopic: cfg.Name + ".billing.events"}
	defer func() {
		if err != nil {
			p.Stop()
			p.Destroy(context.WithoutCancel(ctx))
		}
	}()
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return p, err
	}
	if p.OrdersDB, err = p.createDatabase(ctx, cfg.Name+"_orders"); err != nil {
		return p, err
	}
	if p.BillingDB, err = p.createDatabase(ctx, cfg.Name+"_billing"); err != nil {
		return p, err
	}
	if p.ShimDB, err = p.createDatabase(ctx, cfg.Name+"_shim"); err != nil {
		return p, err
	}
	if err := p.createTopics(ctx, p.OrdersTopic, p.BillingTopic, p.OrdersTopic+".dlt", p.BillingTopic+".dlt"); err != nil {
		return p, err
	}

	brokers := strings.Join(cfg.Brokers, ",")
	dbURL := func(u string) string {
		if cfg.DatabaseParams == "" {
			return u
		}
		if strings.Contains(u, "?") {
			return u + "&" + cfg.DatabaseParams
		}
		return u + "?" + cfg.DatabaseParams
	}
	addrs, adminAddrs := map[string]string{}, map[string]string{}
	for _, pr := range programs {
		addrs[pr.name], err = freeAddr()
		if err != nil {
			return p, err
		}
		adminAddrs[pr.name], err = freeAddr()
		if err != nil {
			return p, err
		}
	}
	p.AdminToken = rand.Text()
	p.ReconcilerAdminURL = "http://" + adminAddrs["reconciler"]
	p.ShimAdminURL = "http://" + adminAddrs["shim"]
	p.BillingAdminURL = "http://" + adminAddrs["billing"]
	p.OrdersAdminURL = "http://" + adminAddrs["orders"]
	p.ReconcilerURL = "http://" + addrs["reconciler"]
	p.ShimURL = "http://" + addrs["shim"]
	p.BillingURL = "http://" + addrs["billing"]
	p.OrdersURL = "http://" + addrs["orders"]
	env := map[string][]string{
		"reconciler": {"LEDGER_PATH=" + filepath.Join(cfg.WorkDir, "ledger.jsonl")},
		"shim": {"DATABASE_URL=" + dbURL(p.ShimDB), "KAFKA_BROKERS=" + brokers, "BILLING_TOPIC=" + p.BillingTopic,
			"CONSUMER_GROUP=" + cfg.Name + "-shim", "RECONCILER_URL=" + p.ReconcilerURL},
		"billing": {"DATABASE_URL=" + dbURL(p.BillingDB), "KAFKA_BROKERS=" + brokers, "ORDERS_TOPIC=" + p.OrdersTopic,
			"BILLING_TOPIC=" + p.BillingTopic, "CONSUMER_GROUP=" + cfg.Name + "-billing"},
		"orders": {"DATABASE_URL=" + dbURL(p.OrdersDB), "KAFKA_BROKERS=" + brokers, "ORDERS_TOPIC=" + p.OrdersTopic},
	}
	// A ledger from an earlier run would count its bookings as this run's.
	if err := os.Remove(filepath.Join(cfg.WorkDir, "ledger.jsonl")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return p, err
	}
	for _, pr := range programs {
		progEnv := append([]string{"ADMIN_ADDR=" + adminAddrs[pr.name], "ADMIN_TOKEN=" + p.AdminToken}, env[pr.name]...)
		debug, err := p.debugEnv(pr.name)
		if err != nil {
			return p, err
		}
		progEnv = append(progEnv, debug...)
		if err := p.startProgram(ctx, pr.name, addrs[pr.name], append(progEnv, cfg.Env[pr.name]...)); err != nil {
			return p, err
		}
	}
	return p, nil
}

func (p *Platform) startProgram(ctx context.Context, name, addr string, env []string) error {
	log, err := os.Create(filepath.Join(p.cfg.WorkDir, name+".log"))
	if err != nil {
		return err
	}
	defer log.Close() // the child has its own descriptor
	cmd := exec.Command(filepath.Join(p.cfg.BinDir, name))
	cmd.Env = append(append(os.Environ(), "HTTP_ADDR="+addr, "LOG_LEVEL=warn"), env...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a Ctrl-C to the driver reaches the driver,
	// which then stops the programs in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.procs = append(p.procs, proc{cmd, exited})

	deadline := time.Now().Add(60 * time.Second) // a first start migrates; a busy machine is slow
	for {
		if err := get(ctx, "http://"+addr+"/readyz"); err == nil {
			p.cfg.Logf("%s ready on http://%s", name, addr)
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited before it was ready; see %s", name, log.Name())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready on %s within 60 s; see %s", name, addr, log.Name())
		}
	}
}

// Stop stops the programs in reverse order: SIGTERM, then SIGKILL after 15 s.
func (p *Platform) Stop() {
	for i := len(p.procs) - 1; i >= 0; i-- {
		pr := p.procs[i]
		_ = pr.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-pr.exited:
		case <-time.After(15 * time.Second):
			p.cfg.Logf("%s did not stop within 15 s; killing it", filepath.Base(pr.cmd.Path))
			_ = pr.cmd.Process.Kill()
			<-pr.exited
		}
	}
	p.procs = nil
}

// Destroy drops the databases and deletes the topics Start created.
func (p *Platform) Destroy(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, p.cfg.PostgresURL); err == nil {
		for _, db := range p.dbs {
			if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
				p.cfg.Logf("dropping database %s: %v", db, err)
			}
		}
		conn.Close(ctx)
	}
	if len(p.topics) > 0 {
		if ctrl, err := kafkautil.Controller(ctx, p.cfg.Brokers); err == nil {
			if err := ctrl.DeleteTopics(p.topics...); err != nil {
				p.cfg.Logf("deleting topics: %v", err)
			}
			ctrl.Close()
		}
	}
	p.dbs, p.topics = nil, nil
}

// CPUTimes returns the CPU time (user + system) each program has used so
// far, read from /proc; a program whose stat cannot be read is left out.
func (p *Platform) CPUTimes() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, pr := range p.procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pr.cmd.Process.Pid))
		if err != nil {
			continue
		}
		// Fields after the command name, which sits in parentheses and may
		// hold spaces: utime and stime are the 12th and 13th of them.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		const clockTicks = 100 // USER_HZ on Linux
		out[filepath.Base(pr.cmd.Path)] = time.Duration(utime+stime) * time.Second / clockTicks
	}
	return out
}

// LogTails returns the last n lines of each program's log, for errors.
func (p *Platform) LogTails(n int) string {
	var b strings.Builder
	for _, pr := range programs {
		data, err := os.ReadFile(filepath.Join(p.cfg.WorkDir, pr.name+".log"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		fmt.Fprintf(&b, "--- %s.log (last %d lines)\n%s\n", pr.name, n, strings.Join(lines[max(0, len(lines)-n):], "\n"))
	}
	return b.String()
}

// K6Env is the environment the scripts in loadtest/k6 read.
func (p *Platform) K6Env() []string {
	return []string{
		"ORDERS_URL=" + p.OrdersURL, "BILLING_URL=" + p.BillingURL, "SHIM_URL=" + p.ShimURL,
		"RECONCILER_URL=" + p.ReconcilerURL,
		"ORDERS_ADMIN_URL=" + p.OrdersAdminURL, "BILLING_ADMIN_URL=" + p.BillingAdminURL, "SHIM_ADMIN_URL=" + p.ShimAdminURL,
		"ORDERS_DB=" + p.OrdersDB, "BILLING_DB=" + p.BillingDB, "SHIM_DB=" + p.ShimDB,
		"KAFKA_BROKERS=" + strings.Join(p.Brokers, ","), "ORDERS_TOPIC=" + p.OrdersTopic,
	}
}

func (p *Platform) createDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, p.cfg.PostgresURL)
	if err != nil {
		return "", fmt.Errorf("connecting to PostgreSQL (start it with `make up`): %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	p.dbs = append(p.dbs, name)
	for _, set := range p.cfg.DatabaseSettings {
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+name+" SET "+set); err != nil {
			return "", fmt.Errorf("database %s: SET %s: %w", name, set, err)
		}
	}
	u, err := url.Parse(p.cfg.PostgresURL)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

func (p *Platform) createTopics(ctx context.Context, names ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ctrl, err := kafkautil.Controller(ctx, p.cfg.Brokers)
	if err != nil {
		return fmt.Errorf("connecting to Kafka (start it with `make up`): %w", err)
	}
	defer ctrl.Close()
	var cfgs []kafka.TopicConfig
	for _, n := range names {
		cfgs = append(cfgs, kafka.TopicConfig{Topic: n, NumPartitions: p.cfg.Partitions, ReplicationFactor: 1})
	}
	if err := ctrl.CreateTopics(cfgs...); err != nil {
		return fmt.Errorf("creating topics: %w", err)
	}
	p.topics = append(p.topics, names...)
	// A new topic's partitions get leaders asynchronously, and a consumer
	// started before its leader serves it gets Not Leader For Partition.
	if err := kafkautil.WaitTopicsReady(ctx, p.cfg.Brokers, names...); err != nil {
		return err
	}
	return nil
}

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func post(ctx context.Context, url, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, b)
	}
	return nil
}

func get(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}
