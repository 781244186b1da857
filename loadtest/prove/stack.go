package prove

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/platform/harness"
)

// Stack is the harness's own PostgreSQL and Kafka, started by
// devstack/stack.sh in a state directory and on ports of its own, so the
// chaos proof can restart them without disturbing the dev stack that other
// work (and `go test`) uses. Every connection the services make goes through
// toxiproxy, which the chaos proof poisons: Postgres through PGProxyPort, and
// Kafka because the broker advertises KafkaProxyPort as its address.
type Stack struct {
	root, dir string
	logf      func(string, ...any)

	PGPort, PGProxyPort                  int
	KafkaPort, KafkaCtrlPort, KafkaProxy int
	toxiPort                             int
	toxi                                 *exec.Cmd
	// HA is the Postgres replication the stack runs with (stack_ha.go);
	// PGStandbyPort and PGStandbyProxy are the standby's, 0 without one.
	HA                            PGReplication
	PGStandbyPort, PGStandbyProxy int
	// kafkaNodes are brokers 2.. of a cluster (stack_cluster.go).
	kafkaNodes []kafkaNode
	// Toxi controls the proxies: "postgres" and "kafka".
	Toxi *toxiproxy.Client
	// Admin is a pool on the postgres database, direct (not proxied).
	Admin *pgxpool.Pool
}

// StackOptions is the shape of the harness's stack: Postgres with or
// without a streaming standby (stack_ha.go), Kafka as one broker or a
// cluster (stack_cluster.go).
type StackOptions struct {
	PGReplication PGReplication // "" (none), "async" or "sync"
	KafkaBrokers  int           // 0 or 1: one broker
}

// StartStack stops whatever an earlier run left in dir, starts toxiproxy,
// then PostgreSQL and a Kafka with empty storage behind it.
func StartStack(ctx context.Context, root, dir, toxiBin string, logf func(string, ...any)) (*Stack, error) {
	return StartStackWith(ctx, root, dir, toxiBin, logf, StackOptions{})
}

// StartStackWith is StartStack in the shape o says.
func StartStackWith(ctx context.Context, root, dir, toxiBin string, logf func(string, ...any), o StackOptions) (*Stack, error) {
	ha := o.PGReplication
	s := &Stack{root: root, dir: dir, logf: logf, HA: ha}
	_ = s.script(ctx, "down") // a run that was killed leaves its servers behind
	// A failover of an earlier run made node b the primary, on a port of
	// that run, and node a its standby or a dead old primary: start from
	// nothing, with node a the primary on PGPort again.
	b, _ := os.ReadFile(filepath.Join(s.pgDataDir(), "primary"))
	_, standbyA := os.Stat(filepath.Join(s.pgDataDir(), "data", "standby.signal"))
	if strings.TrimSpace(string(b)) == "b" || standbyA == nil {
		if err := os.RemoveAll(s.pgDataDir()); err != nil {
			return nil, err
		}
	}
	if err := s.clearKafkaData(); err != nil {
		return nil, err
	}
	ports, err := harness.FreePorts(8) // below the ephemeral range: see there
	if err != nil {
		return nil, err
	}
	s.PGPort, s.PGProxyPort, s.KafkaPort, s.KafkaCtrlPort, s.KafkaProxy, s.toxiPort =
		ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]
	if ha != "" {
		s.PGStandbyPort, s.PGStandbyProxy = ports[6], ports[7]
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(filepath.Join(dir, "toxiproxy.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	s.toxi = exec.Command(toxiBin, "-host", "127.0.0.1", "-port", strconv.Itoa(s.toxiPort))
	s.toxi.Stdout, s.toxi.Stderr = logFile, logFile
	if err := s.toxi.Start(); err != nil {
		return nil, fmt.Errorf("starting toxiproxy: %w", err)
	}
	go func() { _ = s.toxi.Wait(); logFile.Close() }()
	s.Toxi = toxiproxy.NewClient(fmt.Sprintf("127.0.0.1:%d", s.toxiPort))
	if err := waitUntil(ctx, 10*time.Second, func() bool { _, err := s.Toxi.Version(); return err == nil }); err != nil {
		s.Close()
		return nil, fmt.Errorf("toxiproxy did not answer: %w", err)
	}
	proxies := map[string][2]int{"postgres": {s.PGProxyPort, s.PGPort}, "kafka": {s.KafkaProxy, s.KafkaPort}}
	if ha != "" {
		proxies[standbyProxy] = [2]int{s.PGStandbyProxy, s.PGStandbyPort}
	}
	for name, p := range proxies {
		if _, err := s.Toxi.CreateProxy(name, fmt.Sprintf("127.0.0.1:%d", p[0]), fmt.Sprintf("127.0.0.1:%d", p[1])); err != nil {
			s.Close()
			return nil, fmt.Errorf("creating the %s proxy: %w", name, err)
		}
	}
	if err := s.addKafkaNodes(o.KafkaBrokers); err != nil {
		s.Close()
		return nil, err
	}
	logf("stack: starting PostgreSQL :%d and Kafka :%d (through toxiproxy :%d and :%d) in %s",
		s.PGPort, s.KafkaPort, s.PGProxyPort, s.KafkaProxy, dir)
	if err := s.script(ctx, "up"); err != nil {
		s.Close()
		return nil, err
	}
	s.Admin, err = pgxpool.New(ctx, s.PGURL("postgres", false))
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// script runs devstack/stack.sh with this stack's settings.
func (s *Stack) script(ctx context.Context, args ...string) error {
	_, err := s.scriptOut(ctx, args...)
	return err
}

// scriptOut is script, returning what stack.sh printed.
func (s *Stack) scriptOut(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.root, "devstack", "stack.sh"), args...)
	cmd.Env = append(os.Environ(),
		"ONCEFLOW_STACK_DIR="+s.dir,
		fmt.Sprintf("ONCEFLOW_PG_PORT=%d", s.PGPort),
		fmt.Sprintf("ONCEFLOW_KAFKA_PORT=%d", s.KafkaPort),
		fmt.Sprintf("ONCEFLOW_KAFKA_CONTROLLER_PORT=%d", s.KafkaCtrlPort),
		fmt.Sprintf("ONCEFLOW_KAFKA_ADVERTISED_PORT=%d", s.KafkaProxy),
		"ONCEFLOW_KAFKA_HEAP=512m",
		"ONCEFLOW_TOPIC_PARTITIONS=6",
	)
	cmd.Env = append(cmd.Env, s.haEnv()...)
	if s.PGPort == 0 { // "down" before the ports are chosen: only the pid files matter
		cmd.Env = append(os.Environ(), "ONCEFLOW_STACK_DIR="+s.dir)
	}
	cmd.Env = append(cmd.Env, s.clusterEnv()...)
	began := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("stack.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	// Restarts are where a proof's time goes beside its own waits: say how long.
	s.logf("stack %s: stack.sh %s took %.1fs", filepath.Base(s.dir), strings.Join(args, " "), time.Since(began).Seconds())
	return string(out), nil
}

// PGURL is the URL of database db, through the proxy or direct. With a
// standby it lists both servers, primary first, with
// target_session_attrs=read-write: whichever is the primary now answers.
func (s *Stack) PGURL(db string, proxied bool) string {
	port, standby := s.PGPort, s.PGStandbyPort
	if proxied {
		port, standby = s.PGProxyPort, s.PGStandbyProxy
	}
	if s.HA != "" {
		return fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
			port, standby, db)
	}
	return fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/%s?sslmode=disable", port, db)
}

// Brokers is the Kafka bootstrap list (the proxies, which the brokers
// advertise): every broker of a cluster, as production's KAFKA_BROKERS.
func (s *Stack) Brokers() []string {
	return append([]string{fmt.Sprintf("127.0.0.1:%d", s.KafkaProxy)}, s.clusterBrokers()...)
}

// RestartKafka stops the broker (SIGTERM, as an operator's restart does)
// and starts it again; it returns once the broker answers.
func (s *Stack) RestartKafka(ctx context.Context) error {
	if err := s.script(ctx, "down", "kafka"); err != nil {
		return err
	}
	return s.script(ctx, "up")
}

// StopKafka stops the broker (SIGTERM) and leaves it down: an outage.
func (s *Stack) StopKafka(ctx context.Context) error { return s.script(ctx, "down", "kafka") }

// StopPostgres stops PostgreSQL (fast shutdown) and leaves it down.
func (s *Stack) StopPostgres(ctx context.Context) error { return s.script(ctx, "down", "postgres") }

// StartServers starts whichever of PostgreSQL and Kafka is down and returns
// once both answer (stack.sh up is idempotent).
func (s *Stack) StartServers(ctx context.Context) error { return s.script(ctx, "up") }

// RestartPostgres stops PostgreSQL (fast shutdown: every session is cut)
// and starts it again.
func (s *Stack) RestartPostgres(ctx context.Context) error {
	if err := s.script(ctx, "down", "postgres"); err != nil {
		return err
	}
	return s.script(ctx, "up")
}

// Close stops the servers and toxiproxy.
func (s *Stack) Close() {
	if s.Admin != nil {
		s.Admin.Close()
	}
	if s.PGPort != 0 {
		if err := s.script(context.Background(), "down"); err != nil {
			s.logf("stack: %v", err)
		}
	}
	if s.toxi != nil && s.toxi.Process != nil {
		_ = s.toxi.Process.Kill()
	}
}

// waitUntil polls cond every 100ms until it holds or timeout passes.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
