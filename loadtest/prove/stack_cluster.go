package prove

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/onceflow/onceflow/platform/harness"
)

// A Kafka cluster in the harness's stack (NEMESIS_TOPOLOGY=ha): devstack/
// stack.sh starts ONCEFLOW_KAFKA_BROKERS_COUNT brokers, node 1 on the
// stack's KafkaPort behind the "kafka" proxy as before, node n ≥ 2 on ports
// of its own behind a proxy "kafka-n". Each broker advertises its proxy, so
// the services, the proofs' readers and the brokers' own replication all go
// through toxiproxy, as with one broker.

// kafkaNode is broker n ≥ 2 of a cluster.
type kafkaNode struct {
	port, ctrlPort, proxy int
}

// TopologyHA is NEMESIS_TOPOLOGY's cluster form: three brokers.
const (
	TopologySingle = ""
	TopologyHA     = "ha"
	haBrokers      = 3
)

// ParseTopology checks NEMESIS_TOPOLOGY and returns the broker count of
// the harness's stack.
func ParseTopology(s string) (brokers int, err error) {
	switch strings.TrimSpace(s) {
	case TopologySingle, "single":
		return 1, nil
	case TopologyHA:
		return haBrokers, nil
	}
	return 0, fmt.Errorf("NEMESIS_TOPOLOGY: %q is neither ha (three Kafka brokers) nor empty (one)", s)
}

// KafkaBrokerCount is how many brokers the stack runs.
func (s *Stack) KafkaBrokerCount() int { return 1 + len(s.kafkaNodes) }

// clearKafkaData empties every broker's storage of an earlier run: each
// run starts from a fresh cluster (stack.sh formats what it finds empty).
// Brokers of a larger cluster an earlier run left are stopped by the first
// "down", which names the largest count (clusterEnv).
func (s *Stack) clearKafkaData() error {
	dirs, _ := filepath.Glob(filepath.Join(s.dir, "kafka-*", "data"))
	for _, d := range append(dirs, filepath.Join(s.dir, "kafka", "data")) {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	return nil
}

// addKafkaNodes picks the ports of brokers 2..brokers and puts a proxy in
// front of each.
func (s *Stack) addKafkaNodes(brokers int) error {
	if brokers <= 1 {
		return nil
	}
	ports, err := harness.FreePorts(3 * (brokers - 1))
	if err != nil {
		return err
	}
	for i := range brokers - 1 {
		node := kafkaNode{port: ports[3*i], ctrlPort: ports[3*i+1], proxy: ports[3*i+2]}
		name := fmt.Sprintf("kafka-%d", i+2)
		if _, err := s.Toxi.CreateProxy(name, fmt.Sprintf("127.0.0.1:%d", node.proxy), fmt.Sprintf("127.0.0.1:%d", node.port)); err != nil {
			return fmt.Errorf("creating the %s proxy: %w", name, err)
		}
		s.kafkaNodes = append(s.kafkaNodes, node)
	}
	return nil
}

// clusterEnv is what stack.sh needs to know of the cluster. Before the
// ports are chosen (the first "down" of a run) it names the largest
// cluster stack.sh takes, so that a killed run's brokers all stop.
func (s *Stack) clusterEnv() []string {
	if s.PGPort == 0 {
		return []string{"ONCEFLOW_KAFKA_BROKERS_COUNT=5"}
	}
	if len(s.kafkaNodes) == 0 {
		return []string{"ONCEFLOW_KAFKA_BROKERS_COUNT=1"}
	}
	ports, ctrl, adv := []string{strconv.Itoa(s.KafkaPort)}, []string{strconv.Itoa(s.KafkaCtrlPort)}, []string{strconv.Itoa(s.KafkaProxy)}
	for _, n := range s.kafkaNodes {
		ports, ctrl, adv = append(ports, strconv.Itoa(n.port)), append(ctrl, strconv.Itoa(n.ctrlPort)), append(adv, strconv.Itoa(n.proxy))
	}
	return []string{
		fmt.Sprintf("ONCEFLOW_KAFKA_BROKERS_COUNT=%d", s.KafkaBrokerCount()),
		"ONCEFLOW_KAFKA_PORTS=" + strings.Join(ports, ","),
		"ONCEFLOW_KAFKA_CONTROLLER_PORTS=" + strings.Join(ctrl, ","),
		"ONCEFLOW_KAFKA_ADVERTISED_PORTS=" + strings.Join(adv, ","),
		// Three brokers beside the platform's processes on 2 cores.
		"ONCEFLOW_KAFKA_HEAP=448m",
	}
}

// clusterBrokers is the bootstrap list of brokers 2.. (their proxies).
func (s *Stack) clusterBrokers() []string {
	var out []string
	for _, n := range s.kafkaNodes {
		out = append(out, fmt.Sprintf("127.0.0.1:%d", n.proxy))
	}
	return out
}

// BrokerPid is broker n's pid (1-based), from the pid file stack.sh keeps.
func (s *Stack) BrokerPid(n int) (int, error) {
	dir := filepath.Join(s.dir, "kafka")
	if n > 1 {
		dir = fmt.Sprintf("%s-%d", dir, n)
	}
	b, err := os.ReadFile(filepath.Join(dir, "kafka.pid"))
	if err != nil {
		return 0, fmt.Errorf("broker %d: %w", n, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("broker %d: no pid in its pid file", n)
	}
	if syscall.Kill(pid, 0) != nil {
		return 0, fmt.Errorf("broker %d (pid %d) is not running", n, pid)
	}
	return pid, nil
}

// StopBroker stops broker n (SIGTERM, a controlled shutdown that hands its
// leaderships over first) and leaves it down; StartServers starts it again.
func (s *Stack) StopBroker(ctx context.Context, n int) error {
	if s.KafkaBrokerCount() == 1 {
		return s.StopKafka(ctx)
	}
	return s.script(ctx, "down", fmt.Sprintf("kafka-%d", n))
}

// KillBroker SIGKILLs broker n, as a crash does: its leaderships move only
// once the controller sees its session expire.
func (s *Stack) KillBroker(n int) error {
	pid, err := s.BrokerPid(n)
	if err != nil {
		return err
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}
