package prove

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
)

// The cluster's fault kinds (issue 32): with NEMESIS_TOPOLOGY=ha the
// harness's Kafka is three brokers (replication factor 3,
// min.insync.replicas 2, every broker in KAFKA_BROKERS), and the nemesis
// adds these to its schedule. A broker's session with the controller
// expires after 9 s (broker.session.timeout.ms), a consumer's with its
// group after 10 s (the inbox's SessionTimeout): the pauses outlast both.
const (
	NemLeaderKill  = "leaderkill"  // SIGKILL the broker leading a partition of the orders or billing topic; started again after a while
	NemBrokerPause = "brokerpause" // SIGSTOP a broker past the brokers' and the groups' session timeouts, then SIGCONT
	NemMinority    = "minority"    // one broker of three stopped (SIGTERM) for a while: every write goes on (two copies remain)
	NemMajority    = "majority"    // two brokers of three stopped: writes are refused (NOT_ENOUGH_REPLICAS) and producers must wait, not drop
)

// NemClusterKinds are the cluster's fault kinds, in the order the schedule
// weighs them; NEMESIS_TOPOLOGY=ha adds them to every kind (or to those
// NEMESIS= names).
var NemClusterKinds = []string{NemLeaderKill, NemBrokerPause, NemMinority, NemMajority}

// probePartitions is the probe topic's partition count (createTopics').
const probePartitions = 6

// nemProbeTimeout bounds how long a fault waits for every partition to take
// writes again before it reports that they did not.
const nemProbeTimeout = 2 * time.Minute

// withTopology adds the cluster's kinds to kinds on a cluster (all of them
// unless NEMESIS= names some or excludes them), and refuses them on one
// broker.
func withTopology(kinds, sel []string, topology string) ([]string, error) {
	ha := topology == TopologyHA
	named := false
	for _, k := range sel {
		k = strings.TrimSpace(k)
		if k != "" && !strings.HasPrefix(k, "-") {
			named = true
		}
	}
	for _, k := range NemClusterKinds {
		switch {
		case slices.Contains(kinds, k) && !ha:
			return nil, fmt.Errorf("NEMESIS=%s: %s needs a Kafka cluster (NEMESIS_TOPOLOGY=ha)", strings.Join(sel, ","), k)
		case ha && !named && !slices.Contains(sel, "-"+k) && !slices.Contains(kinds, k):
			kinds = append(kinds, k)
		}
	}
	return kinds, nil
}

// scheduleCluster draws a cluster step's target and hold. Brokers are 1–3,
// the cluster's node ids.
func scheduleCluster(s *step, dur func(lo, hi time.Duration) time.Duration, intn func(int) int) {
	switch s.Kind {
	case NemLeaderKill:
		s.Target = []string{"orders", "billing"}[intn(2)]
		s.Param = "partition " + strconv.Itoa(intn(6))
		s.Hold = dur(5*time.Second, 25*time.Second)
	case NemBrokerPause:
		s.N, s.Hold = 1+intn(haBrokers), dur(12*time.Second, 40*time.Second)
	case NemMinority:
		s.N, s.Hold = 1+intn(haBrokers), dur(10*time.Second, 45*time.Second)
	case NemMajority:
		s.N, s.Hold = 1+intn(haBrokers), dur(8*time.Second, 30*time.Second)
	}
}

// clusterKeys are what a cluster step holds: the servers, as the kafka and
// postgres steps do (stack.sh up, which both call, starts whatever is down
// and waits for every broker, a paused one included).
func clusterKeys() []string { return []string{NemKafka + "/", NemPostgres + "/"} }

// cluster performs a cluster step and clears it; it returns what it did,
// with how long the cluster took to take writes on every partition again
// (probeWrites), the number issue 32 asks for.
func (n *nemesisRun) cluster(ctx context.Context, s step) (string, error) {
	stack := n.h.stack
	if stack.KafkaBrokerCount() < haBrokers {
		return "skipped: one broker (NEMESIS_TOPOLOGY=ha runs three)", nil
	}
	cctx := context.WithoutCancel(ctx)
	began := time.Now()
	switch s.Kind {
	case NemLeaderKill:
		topic := n.p.OrdersTopic
		if s.Target == "billing" {
			topic = n.p.BillingTop
		}
		partition, _ := strconv.Atoi(strings.TrimPrefix(s.Param, "partition "))
		leader, err := partitionLeader(ctx, stack.Brokers(), topic, partition)
		if err != nil {
			return "", err
		}
		if err := stack.KillBroker(leader); err != nil {
			return "", err
		}
		began = time.Now()
		resumed, perr := n.probeWrites(ctx, began)
		hold(ctx, time.Until(began.Add(s.Hold)))
		down := time.Since(began)
		serr := n.startServers(cctx)
		return fmt.Sprintf("SIGKILL broker %d, leader of %s/%d; every partition took acks=all writes again after %s; started again after %.1fs",
			leader, s.Target, partition, resumed, down.Seconds()), errors.Join(perr, serr)
	case NemBrokerPause:
		pid, err := stack.BrokerPid(s.N)
		if err != nil {
			return "", err
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return "", err
		}
		resumed, perr := n.probeWrites(ctx, began)
		hold(ctx, time.Until(began.Add(s.Hold)))
		_ = syscall.Kill(pid, syscall.SIGCONT)
		return fmt.Sprintf("SIGSTOP broker %d (pid %d) for %.1fs, then SIGCONT; every partition took acks=all writes again after %s",
			s.N, pid, time.Since(began).Seconds(), resumed), perr
	case NemMinority:
		if err := n.stopBrokers(cctx, s.N); err != nil {
			return "", err
		}
		resumed, perr := n.probeWrites(ctx, began)
		hold(ctx, time.Until(began.Add(s.Hold)))
		down := time.Since(began)
		serr := n.startServers(cctx)
		return fmt.Sprintf("broker %d stopped (SIGTERM) for %.1fs; every partition took acks=all writes again after %s",
			s.N, down.Seconds(), resumed), errors.Join(perr, serr)
	case NemMajority:
		second := s.N%haBrokers + 1
		if err := n.stopBrokers(cctx, s.N, second); err != nil {
			return "", err
		}
		// With two of three down no partition has the two in-sync copies
		// min.insync.replicas asks for: an acks=all write must be refused,
		// never acknowledged with one copy.
		refused := writesRefused(ctx, stack.Brokers(), n.probeTopic, began.Add(s.Hold))
		hold(ctx, time.Until(began.Add(s.Hold)))
		restart := time.Now()
		serr := n.startServers(cctx)
		resumed, perr := n.probeWrites(ctx, restart)
		detail := fmt.Sprintf("brokers %d and %d stopped (SIGTERM) for %.1fs; %s; every partition took acks=all writes again %s after the restart began",
			s.N, second, restart.Sub(began).Seconds(), refused, resumed)
		if strings.HasPrefix(refused, "acknowledged") {
			perr = errors.Join(perr, errors.New("an acks=all write was acknowledged with two of three brokers down"))
		}
		return detail, errors.Join(perr, serr)
	}
	return "", fmt.Errorf("no cluster fault kind %q", s.Kind)
}

// stopBrokers stops the brokers (SIGTERM), one stack.sh call each, holding
// the stack's lock only for the calls.
func (n *nemesisRun) stopBrokers(ctx context.Context, brokers ...int) error {
	n.stackMu.Lock()
	defer n.stackMu.Unlock()
	for _, b := range brokers {
		if err := n.h.stack.StopBroker(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

func (n *nemesisRun) startServers(ctx context.Context) error {
	n.stackMu.Lock()
	defer n.stackMu.Unlock()
	return n.h.stack.StartServers(ctx)
}

// partitionLeader is the node id of the broker leading topic's partition.
func partitionLeader(ctx context.Context, brokers []string, topic string, partition int) (int, error) {
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: transport}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("finding the leader of %s/%d: %w", topic, partition, err)
	}
	for _, t := range md.Topics {
		for _, p := range t.Partitions {
			if p.ID == partition && p.Leader.ID > 0 {
				return p.Leader.ID, nil
			}
		}
	}
	return 0, fmt.Errorf("%s/%d has no leader", topic, partition)
}

// ensureProbeTopic creates the topic the cluster faults time their
// recovery on: 6 partitions replicated as the services' topics are, so its
// leaders spread over the brokers as theirs do. The probe never writes to
// the services' topics, whose consumers would dead-letter its records.
func (n *nemesisRun) ensureProbeTopic(ctx context.Context) error {
	n.probeTopic = n.p.OrdersTopic + ".probe"
	return createTopics(ctx, n.h.stack.Brokers(), n.probeTopic)
}

// probeWrites writes one record with acks=all to every partition of the
// probe topic, round after round, until a round has every write taken (or
// nemProbeTimeout passes), and returns how long after since that was. A
// round fails while a partition has no leader the client can reach, or
// fewer in-sync copies than min.insync.replicas.
func (n *nemesisRun) probeWrites(ctx context.Context, since time.Time) (string, error) {
	brokers := n.h.stack.Brokers()
	deadline := since.Add(nemProbeTimeout)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if last = probeRound(ctx, brokers, n.probeTopic); last == nil {
			d := time.Since(since)
			n.h.logf("    cluster: every partition took writes again %.1fs after the fault", d.Seconds())
			return fmt.Sprintf("%.1fs", d.Seconds()), nil
		}
		hold(ctx, 200*time.Millisecond) // the next round
	}
	return "never (within " + nemProbeTimeout.String() + ")", fmt.Errorf("the cluster did not take writes on every partition again: %v", last)
}

// writesRefused tries up to five rounds of the probe, a second apart and
// none starting after until (the fault's end), and says what became of
// them: refused is what a majority down must give.
func writesRefused(ctx context.Context, brokers []string, topic string, until time.Time) string {
	var last error
	rounds := 0
	for rounds < 5 && (rounds == 0 || time.Now().Before(until)) {
		rounds++
		if last = probeRound(ctx, brokers, topic); last == nil {
			return "acknowledged: an acks=all write went through"
		}
		hold(ctx, time.Second)
	}
	return fmt.Sprintf("acks=all writes refused meanwhile, %d rounds of %d (%s)", rounds, probePartitions, firstLine(last))
}

// probeRound writes one record to every partition of topic, through a
// writer of its own (fresh metadata), each with acks=all and no retry.
func probeRound(ctx context.Context, brokers []string, topic string) error {
	transport := &kafka.Transport{DialTimeout: 2 * time.Second, MetadataTTL: time.Second}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Transport: transport,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		RequiredAcks: kafka.RequireAll, MaxAttempts: 1, BatchTimeout: time.Millisecond,
		WriteTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second,
	}
	defer w.Close()
	msgs := make([]kafka.Message, probePartitions)
	for i := range msgs {
		msgs[i] = kafka.Message{Partition: i, Value: []byte("probe")}
	}
	wctx, cancel := context.WithTimeout(ctx, 6*time.Second)
	defer cancel()
	return w.WriteMessages(wctx, msgs...)
}

func firstLine(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

func topologyNote(topology string) string {
	if topology == "" {
		return ""
	}
	return " NEMESIS_TOPOLOGY=" + topology
}
