package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Connect is a Kafka Connect worker running Debezium's PostgreSQL connector
// with the connector file the docs ship (docs/debezium), byte for byte: it
// runs devstack/connect.sh, as `make up-debezium` does, and gives the
// file's ${env:ONCEFLOW_DEBEZIUM_*} placeholders this stack's values. The
// proofs (RELAY_MODE=debezium), the quick Debezium test and the bench's
// peers start it so.
type Connect struct {
	cfg  ConnectConfig
	port int
}

// ConnectConfig says where a Connect publishes from and to.
type ConnectConfig struct {
	// Root is the repository root (devstack/connect.sh, docs/debezium).
	Root string
	// Dir holds the worker's configuration, offsets, log and pid
	// (ONCEFLOW_CONNECT_DIR): one per worker.
	Dir string
	// Brokers is the Kafka it publishes to.
	Brokers []string
	// DBHost, DBPort, DBName, DBUser and DBPassword are the database whose
	// outbox it streams, as a role with REPLICATION (the service's _repl
	// role: nothing else is needed, docs/debezium).
	DBHost     string
	DBPort     int
	DBName     string
	DBUser     string
	DBPassword string
	// Slot is the connector's replication slot (cluster-wide name).
	Slot string
	// Topic receives the events (the service's ORDERS_TOPIC).
	Topic string
	// Heap is the worker's maximum heap. Default 384m.
	Heap string
	// Logf receives a line per start, kill and stop. Default: none.
	Logf func(format string, args ...any)
}

// NewConnect returns a Connect for cfg, not started, on a free REST port.
func NewConnect(cfg ConnectConfig) (*Connect, error) {
	if cfg.Root == "" || cfg.Dir == "" || len(cfg.Brokers) == 0 || cfg.DBName == "" || cfg.Slot == "" || cfg.Topic == "" {
		return nil, errors.New("harness: ConnectConfig needs Root, Dir, Brokers, DBName, Slot and Topic")
	}
	if cfg.Heap == "" {
		cfg.Heap = "384m"
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	ports, err := FreePorts(1)
	if err != nil {
		return nil, err
	}
	c := &Connect{cfg: cfg, port: ports[0]}
	return c, os.MkdirAll(cfg.Dir, 0o755)
}

// CheckConnect returns nil when java and the Connect and Debezium jars are
// on this machine, else an error that says how to get them
// (devstack/connect.sh check).
func CheckConnect(ctx context.Context, root string) error {
	out, err := exec.CommandContext(ctx, filepath.Join(root, "devstack", "connect.sh"), "check").CombinedOutput()
	if err != nil {
		return fmt.Errorf("kafka connect cannot start here: %s", strings.TrimSpace(string(out)))
	}
	return nil
}

// Up starts the worker and registers the connector (fetching the jars on a
// first run), and returns once its task runs; a worker already running is
// only checked.
func (c *Connect) Up(ctx context.Context) error { return c.script(ctx, "up") }

// Kill SIGKILLs the worker: a relay crash mid-stream. Debezium republishes
// from its last flushed offset when it is up again.
func (c *Connect) Kill(ctx context.Context) error { return c.script(ctx, "kill") }

// Down stops the worker (SIGTERM: it commits its offsets); a worker that is
// not running is fine.
func (c *Connect) Down(ctx context.Context) error { return c.script(ctx, "down") }

// URL is the worker's REST API.
func (c *Connect) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", c.port) }

// Pid is the worker's process id, 0 when it is not running.
func (c *Connect) Pid() int {
	b, err := os.ReadFile(filepath.Join(c.cfg.Dir, "connect.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// LogPath is the worker's log.
func (c *Connect) LogPath() string { return filepath.Join(c.cfg.Dir, "connect.log") }

func (c *Connect) script(ctx context.Context, cmd string) error {
	sh := exec.CommandContext(ctx, filepath.Join(c.cfg.Root, "devstack", "connect.sh"), cmd)
	sh.Env = append(os.Environ(),
		"ONCEFLOW_CONNECT_DIR="+c.cfg.Dir,
		"ONCEFLOW_CONNECT_PORT="+strconv.Itoa(c.port),
		"ONCEFLOW_CONNECT_HEAP="+c.cfg.Heap,
		"ONCEFLOW_CONNECT_BROKERS="+strings.Join(c.cfg.Brokers, ","),
		// The shipped file, whatever the caller's environment says.
		"ONCEFLOW_CONNECT_CONNECTOR="+filepath.Join(c.cfg.Root, "docs", "debezium", "orders-outbox-connector.json"),
		"ONCEFLOW_DEBEZIUM_DB_HOST="+c.cfg.DBHost,
		"ONCEFLOW_DEBEZIUM_DB_PORT="+strconv.Itoa(c.cfg.DBPort),
		"ONCEFLOW_DEBEZIUM_DB_USER="+c.cfg.DBUser,
		"ONCEFLOW_DEBEZIUM_DB_PASSWORD="+c.cfg.DBPassword,
		"ONCEFLOW_DEBEZIUM_DB_NAME="+c.cfg.DBName,
		"ONCEFLOW_DEBEZIUM_SLOT="+c.cfg.Slot,
		"ONCEFLOW_DEBEZIUM_TOPIC="+c.cfg.Topic,
	)
	began := time.Now()
	out, err := sh.CombinedOutput()
	if err != nil {
		return fmt.Errorf("devstack/connect.sh %s: %w\n%s", cmd, err, out)
	}
	c.cfg.Logf("kafka connect (%s): connect.sh %s took %.1fs", filepath.Base(c.cfg.Dir), cmd, time.Since(began).Seconds())
	return nil
}
