package kafkautil

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/kafkasafe"
)

// Replication is how many copies of a topic's partitions the cluster keeps
// and how many must have a write before acks=all succeeds
// (kafkasafe.Replication: production runs Factor 3, MinISR 2;
// docs/operations.md).
type Replication = kafkasafe.Replication

// ReplicationFor is the default for a cluster of brokers brokers
// (kafkasafe.ReplicationFor): a factor of min(3, brokers) and a min ISR of
// min(2, factor).
func ReplicationFor(brokers int) Replication { return kafkasafe.ReplicationFor(brokers) }

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
	return Cluster{Brokers: md.Brokers, Size: kafkasafe.ClusterSize(md)}
}

// TopicSpec is how EnsureTopics creates a topic that does not exist
// (kafkasafe.TopicSpec; DeadLetters adds each topic's ".dlt" beside it).
type TopicSpec = kafkasafe.TopicSpec

// TopicState is what EnsureTopics found or did for one topic.
type TopicState = kafkasafe.TopicState

// EnsureTopics is kafkasafe.EnsureTopics connecting with s (TLS, SASL) to
// bootstrap: it creates those of topics that do not exist, with spec's
// partitions and replication (by default ReplicationFor the cluster's
// size), leaves existing ones alone and reports each. It does not wait for
// leaders (WaitTopicsReady does).
func EnsureTopics(ctx context.Context, s Security, bootstrap []string, spec TopicSpec, topics ...string) ([]TopicState, error) {
	transport := s.Transport()
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(bootstrap...), Transport: transport}
	return kafkasafe.EnsureTopics(ctx, client, spec, topics...)
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
