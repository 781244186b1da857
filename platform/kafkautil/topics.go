package kafkautil

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/segmentio/kafka-go"
)

// Replication is how many copies of a topic's partitions the cluster keeps
// (Factor) and how many of them must have a write before a producer that
// asks for acks=all (every writer NewWriter builds) is told it succeeded
// (MinISR, the topic's min.insync.replicas).
//
// The pair decides what a broker's death costs. With Factor 1 a dead
// broker's partitions are gone until it returns; with MinISR 1 and any
// Factor, acks=all is satisfied by the leader alone, and a leader that dies
// right after acknowledging takes the write with it. Production runs
// Factor 3, MinISR 2: one broker can die at any time without losing an
// acknowledged write or stopping the writes (docs/operations.md).
type Replication struct {
	Factor int
	MinISR int
}

// ReplicationFor is the default for a cluster of brokers brokers: a factor
// of min(3, brokers) and a min ISR of min(2, factor). It stays correct on a
// single broker (1 and 1, the only possible values) and is the production
// shape from three brokers on.
func ReplicationFor(brokers int) Replication {
	f := min(3, max(brokers, 1))
	return Replication{Factor: f, MinISR: min(2, f)}
}

// Validate reports a pair the cluster could not honour: a factor above its
// broker count, or a min ISR above the factor, which would refuse every
// acks=all write.
func (r Replication) Validate(brokers int) error {
	switch {
	case r.Factor < 1:
		return fmt.Errorf("replication factor must be at least 1, got %d", r.Factor)
	case brokers > 0 && r.Factor > brokers:
		return fmt.Errorf("replication factor %d needs %d brokers, the cluster has %d", r.Factor, r.Factor, brokers)
	case r.MinISR < 1 || r.MinISR > r.Factor:
		return fmt.Errorf("min.insync.replicas must be 1 to the replication factor %d, got %d", r.Factor, r.MinISR)
	}
	return nil
}

// Cluster is what a metadata request tells about the brokers.
type Cluster struct {
	// Brokers are the live brokers, as they advertise themselves.
	Brokers []kafka.Broker
	// Size counts every broker the cluster knows of: the live ones and
	// those that hold a replica of a topic but are down now. A broker that
	// is down and holds nothing is not known to a client.
	Size int
}

// Addrs returns the advertised host:port of the live brokers.
func (c Cluster) Addrs() []string {
	out := make([]string, 0, len(c.Brokers))
	for _, b := range c.Brokers {
		out = append(out, b.Host+":"+strconv.Itoa(b.Port))
	}
	slices.Sort(out)
	return out
}

// DescribeCluster asks the brokers in bootstrap for the cluster's metadata.
func DescribeCluster(ctx context.Context, s Security, bootstrap []string) (Cluster, error) {
	transport := s.Transport()
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(bootstrap...), Transport: transport}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return Cluster{}, fmt.Errorf("reading the cluster's metadata from %v: %w", bootstrap, err)
	}
	return clusterOf(md), nil
}

func clusterOf(md *kafka.MetadataResponse) Cluster {
	ids := map[int]bool{}
	for _, b := range md.Brokers {
		ids[b.ID] = true
	}
	for _, t := range md.Topics {
		for _, p := range t.Partitions {
			for _, r := range p.Replicas {
				ids[r.ID] = true
			}
		}
	}
	return Cluster{Brokers: md.Brokers, Size: len(ids)}
}

// TopicSpec is how EnsureTopics creates a topic that does not exist.
type TopicSpec struct {
	Partitions int
	// Replication: zero means ReplicationFor(the cluster's size, Cluster.Size).
	Replication Replication
	// Configs are further topic settings (min.insync.replicas is set from
	// Replication).
	Configs []kafka.ConfigEntry
}

// TopicState is what EnsureTopics found or did for one topic.
type TopicState struct {
	Name        string
	Created     bool
	Partitions  int
	Replication Replication // for an existing topic, MinISR is 0 (not read)
}

// EnsureTopics creates those of topics that do not exist, with spec's
// partitions and replication (by default ReplicationFor the cluster's
// size), and reports each. Existing topics are left alone even when they
// differ: repartitioning breaks per-key order and raising a replication
// factor moves data, decisions for a person, not for a setup step; the
// caller reports the difference. It does not wait for leaders
// (WaitTopicsReady does).
func EnsureTopics(ctx context.Context, s Security, bootstrap []string, spec TopicSpec, topics ...string) ([]TopicState, error) {
	if spec.Partitions < 1 {
		return nil, fmt.Errorf("partitions must be at least 1, got %d", spec.Partitions)
	}
	transport := s.Transport()
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(bootstrap...), Transport: transport}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return nil, fmt.Errorf("reading the cluster's metadata from %v: %w", bootstrap, err)
	}
	repl := spec.Replication
	if repl == (Replication{}) {
		repl = ReplicationFor(clusterOf(md).Size)
	}
	if err := repl.Validate(len(md.Brokers)); err != nil {
		return nil, fmt.Errorf("creating topics %v: %w", topics, err)
	}
	existing := map[string]kafka.Topic{}
	for _, t := range md.Topics {
		existing[t.Name] = t
	}
	states := make([]TopicState, 0, len(topics))
	var create []kafka.TopicConfig
	for _, name := range topics {
		if t, ok := existing[name]; ok && t.Error == nil {
			st := TopicState{Name: name, Partitions: len(t.Partitions)}
			if len(t.Partitions) > 0 {
				st.Replication.Factor = len(t.Partitions[0].Replicas)
			}
			states = append(states, st)
			continue
		}
		configs := append(slices.Clone(spec.Configs),
			kafka.ConfigEntry{ConfigName: "min.insync.replicas", ConfigValue: strconv.Itoa(repl.MinISR)})
		create = append(create, kafka.TopicConfig{Topic: name, NumPartitions: spec.Partitions,
			ReplicationFactor: repl.Factor, ConfigEntries: configs})
		states = append(states, TopicState{Name: name, Created: true, Partitions: spec.Partitions, Replication: repl})
	}
	if len(create) == 0 {
		return states, nil
	}
	// The client sends CreateTopics to the controller, whichever broker that is.
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: create})
	if err != nil {
		return nil, fmt.Errorf("creating topics: %w", err)
	}
	var errs []error
	for name, err := range resp.Errors {
		// Another creator won the race: the topic exists, which is all we want.
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			errs = append(errs, fmt.Errorf("creating topic %s: %w", name, err))
		}
	}
	return states, errors.Join(errs...)
}

// Unlisted compares a bootstrap list (KAFKA_BROKERS) with the cluster:
// short reports that it names fewer brokers than the cluster has, and
// unlisted the live brokers' advertised addresses it does not name.
//
// kafka-go learns the cluster's metadata only through the addresses it was
// given, so a service whose list names one broker of three loses the whole
// cluster while that one is down, though the other two could serve it.
func (c Cluster) Unlisted(listed []string) (unlisted []string, short bool) {
	named := map[string]bool{}
	for _, a := range listed {
		named[a] = true
	}
	for _, a := range c.Addrs() {
		if !named[a] {
			unlisted = append(unlisted, a)
		}
	}
	return unlisted, len(named) < c.Size
}
