package rig

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/kafkautil"
)

// Build compiles the four programs from the repository at root into dir
// (harness.Build: once per process for each root and dir). The BASE mode
// of `make bench` builds an older revision's tree into another dir.
func Build(ctx context.Context, root, dir string) error {
	_, err := harness.Build(ctx, root, dir)
	return err
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
	// PrePickPorts hands the programs ports picked in advance instead of
	// reading the ones they bound to port 0 from their log: only for binaries
	// built from an older revision (BASE), which do not log their
	// addresses. Racy (harness.Config.PrePickPorts).
	PrePickPorts bool
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
	procs  []*harness.Proc // in start order
	dbs    []string
	topics []string
}

// Start creates the databases and topics, starts the four programs on port
// 0 (each one's downstream first) and returns once each answers /readyz. On
// an error it takes down what it started.
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
	p.AdminToken = rand.Text()
	// The shim's env needs the reconciler's address, known once it started:
	// each program's env is made when its turn comes.
	env := map[string]func() []string{
		"reconciler": func() []string { return []string{"LEDGER_PATH=" + filepath.Join(cfg.WorkDir, "ledger.jsonl")} },
		"shim": func() []string {
			return []string{"DATABASE_URL=" + dbURL(p.ShimDB), "KAFKA_BROKERS=" + brokers, "BILLING_TOPIC=" + p.BillingTopic,
				"CONSUMER_GROUP=" + cfg.Name + "-shim", "RECONCILER_URL=" + p.ReconcilerURL}
		},
		"billing": func() []string {
			return []string{"DATABASE_URL=" + dbURL(p.BillingDB), "KAFKA_BROKERS=" + brokers, "ORDERS_TOPIC=" + p.OrdersTopic,
				"BILLING_TOPIC=" + p.BillingTopic, "CONSUMER_GROUP=" + cfg.Name + "-billing"}
		},
		"orders": func() []string {
			return []string{"DATABASE_URL=" + dbURL(p.OrdersDB), "KAFKA_BROKERS=" + brokers, "ORDERS_TOPIC=" + p.OrdersTopic}
		},
	}
	// A ledger from an earlier run would count its bookings as this run's.
	if err := os.Remove(filepath.Join(cfg.WorkDir, "ledger.jsonl")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return p, err
	}
	for _, spec := range harness.Programs {
		progEnv := append([]string{"ADMIN_TOKEN=" + p.AdminToken}, env[spec.Name]()...)
		debug, err := p.debugEnv(spec.Name)
		if err != nil {
			return p, err
		}
		progEnv = append(progEnv, debug...)
		pr, err := p.startProgram(ctx, spec, append(progEnv, cfg.Env[spec.Name]...))
		if err != nil {
			return p, err
		}
		url, adminURL := pr.URL(), pr.AdminURL()
		switch spec.Name {
		case "reconciler":
			p.ReconcilerURL, p.ReconcilerAdminURL = url, adminURL
		case "shim":
			p.ShimURL, p.ShimAdminURL = url, adminURL
		case "billing":
			p.BillingURL, p.BillingAdminURL = url, adminURL
		case "orders":
			p.OrdersURL, p.OrdersAdminURL = url, adminURL
		}
	}
	return p, nil
}

// startProgram starts one program (env as KEY=value) and waits until it is
// ready.
func (p *Platform) startProgram(ctx context.Context, spec harness.Spec, env []string) (*harness.Proc, error) {
	vars := map[string]string{"LOG_LEVEL": "warn"}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	pr, err := harness.New(harness.Config{Spec: spec, Bin: filepath.Join(p.cfg.BinDir, spec.Name), Env: vars,
		LogPath: filepath.Join(p.cfg.WorkDir, spec.Name+".log"), PrePickPorts: p.cfg.PrePickPorts})
	if err != nil {
		return nil, err
	}
	// Appended to by each start: a log from an earlier run would mislead.
	if err := os.Remove(pr.LogPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := pr.Start(ctx); err != nil {
		return nil, err
	}
	p.procs = append(p.procs, pr)
	// A first start migrates; a busy machine is slow.
	if err := pr.WaitReady(ctx, "/readyz", 60*time.Second); err != nil {
		return nil, err
	}
	p.cfg.Logf("%s ready on %s", spec.Name, pr.URL())
	return pr, nil
}

// Stop stops the programs in reverse order: SIGTERM, then SIGKILL after 15 s.
func (p *Platform) Stop() {
	for i := len(p.procs) - 1; i >= 0; i-- {
		if err := p.procs[i].Stop(15 * time.Second); errors.Is(err, harness.ErrHung) {
			p.cfg.Logf("%v", err)
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
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pr.Pid()))
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
		out[pr.Name()] = time.Duration(utime+stime) * time.Second / clockTicks
	}
	return out
}

// LogTails returns the last n lines of each program's log, for errors.
func (p *Platform) LogTails(n int) string {
	var b strings.Builder
	for _, spec := range harness.Programs {
		path := filepath.Join(p.cfg.WorkDir, spec.Name+".log")
		if _, err := os.Stat(path); err != nil {
			continue
		}
		fmt.Fprintf(&b, "--- %s.log (last %d lines)\n%s\n", spec.Name, n, harness.Tail(path, n))
	}
	return b.String()
}

// K6Env is the environment the scripts in loadtest/k6 read.
func (p *Platform) K6Env() []string {
	return []string{
		"ORDERS_URL=" + p.OrdersURL, "BILLING_URL=" + p.BillingURL, "SHIM_URL=" + p.ShimURL,
		"RECONCILER_URL=" + p.ReconcilerURL,
		"ORDERS_ADMIN_URL=" + p.OrdersAdminURL, "BILLING_ADMIN_URL=" + p.BillingAdminURL, "SHIM_ADMIN_URL=" + p.ShimAdminURL,
		"ORDERS_DB=" + k6DB(p.OrdersDB), "BILLING_DB=" + k6DB(p.BillingDB), "SHIM_DB=" + k6DB(p.ShimDB),
		"KAFKA_BROKERS=" + strings.Join(p.Brokers, ","), "ORDERS_TOPIC=" + p.OrdersTopic,
	}
}

// K6ApplicationName is the application_name of k6's connections to the
// databases (K6Env), so that the Postgres backends serving k6's own queries
// (its settlement poll, its audit) can be told from the platform's and
// charged to k6 (K6BackendPIDs).
const K6ApplicationName = "onceflow-k6"

// k6DB is dbURL with k6's application_name.
func k6DB(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return dbURL
	}
	q := u.Query()
	q.Set("application_name", K6ApplicationName)
	u.RawQuery = q.Encode()
	return u.String()
}

// K6BackendPIDs returns the pids of the Postgres backends of the server at
// pgURL connected with K6ApplicationName now.
func K6BackendPIDs(ctx context.Context, pgURL string) ([]int, error) {
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, K6ApplicationName)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
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
	// Replicated as the cluster allows (kafkautil.ReplicationFor), so a
	// benchmark against a cluster pays for acks=all as production does.
	if _, err := kafkautil.EnsureTopics(ctx, kafkautil.Security{}, p.cfg.Brokers, kafkautil.TopicSpec{Partitions: p.cfg.Partitions}, names...); err != nil {
		return fmt.Errorf("creating topics (is Kafka up? `make up`): %w", err)
	}
	p.topics = append(p.topics, names...)
	// A new topic's partitions get leaders asynchronously, and a consumer
	// started before its leader serves it gets Not Leader For Partition.
	if err := kafkautil.WaitTopicsReady(ctx, p.cfg.Brokers, names...); err != nil {
		return err
	}
	return nil
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
