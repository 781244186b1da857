package kafkautil_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

func TestReplicationFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		brokers int
		want    kafkautil.Replication
	}{
		{0, kafkautil.Replication{Factor: 1, MinISR: 1}},
		{1, kafkautil.Replication{Factor: 1, MinISR: 1}},
		{2, kafkautil.Replication{Factor: 2, MinISR: 2}},
		{3, kafkautil.Replication{Factor: 3, MinISR: 2}},
		{5, kafkautil.Replication{Factor: 3, MinISR: 2}},
	} {
		if got := kafkautil.ReplicationFor(tc.brokers); got != tc.want {
			t.Errorf("ReplicationFor(%d) = %+v, want %+v", tc.brokers, got, tc.want)
		}
		if err := tc.want.Validate(max(tc.brokers, 1)); err != nil {
			t.Errorf("ReplicationFor(%d) does not validate: %v", tc.brokers, err)
		}
	}
	for _, bad := range []struct {
		r       kafkautil.Replication
		brokers int
	}{
		{kafkautil.Replication{Factor: 3, MinISR: 2}, 1},
		{kafkautil.Replication{Factor: 2, MinISR: 3}, 3},
		{kafkautil.Replication{Factor: 0, MinISR: 0}, 3},
	} {
		if err := bad.r.Validate(bad.brokers); err == nil {
			t.Errorf("%+v on %d brokers validated", bad.r, bad.brokers)
		}
	}
}

// TestEnsureTopicsTakesTheClustersReplication creates a topic without
// saying how it is replicated: it must get the cluster's default, read back
// from the broker (on the dev stack's single broker 1 and 1, on a cluster
// of three — ONCEFLOW_TEST_KAFKA_BROKERS naming it — 3 and 2), and a second
// call must leave it alone and report it.
func TestEnsureTopicsTakesTheClustersReplication(t *testing.T) {
	t.Parallel()
	brokers := testinfra.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cluster, err := kafkautil.DescribeCluster(ctx, kafkautil.Security{}, brokers)
	if err != nil {
		t.Fatal(err)
	}
	want := kafkautil.ReplicationFor(cluster.Size)
	name := testinfra.Name("ensure")
	t.Cleanup(func() { deleteTopics(t, brokers, name) })

	states, err := kafkautil.EnsureTopics(ctx, kafkautil.Security{}, brokers, kafkautil.TopicSpec{Partitions: 3}, name)
	if err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	if len(states) != 1 || !states[0].Created || states[0].Replication != want {
		t.Fatalf("EnsureTopics on %d brokers reported %+v, want one topic created with %+v", cluster.Size, states, want)
	}
	if err := kafkautil.WaitTopicsReady(ctx, brokers, name); err != nil {
		t.Fatal(err)
	}
	if got := readReplication(t, ctx, brokers, name); got != want {
		t.Errorf("the broker holds %s with %+v, want %+v (cluster of %d)", name, got, want, cluster.Size)
	}

	again, err := kafkautil.EnsureTopics(ctx, kafkautil.Security{}, brokers, kafkautil.TopicSpec{Partitions: 6}, name)
	if err != nil {
		t.Fatalf("EnsureTopics on an existing topic: %v", err)
	}
	if len(again) != 1 || again[0].Created || again[0].Partitions != 3 || again[0].Replication.Factor != want.Factor {
		t.Errorf("EnsureTopics on an existing topic reported %+v, want it left with 3 partitions and factor %d", again, want.Factor)
	}
}

// TestEnsureTopicsRefusesMoreReplicasThanBrokers: a factor above the
// cluster's brokers is refused before anything is created, naming both.
func TestEnsureTopicsRefusesMoreReplicasThanBrokers(t *testing.T) {
	t.Parallel()
	brokers := testinfra.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cluster, err := kafkautil.DescribeCluster(ctx, kafkautil.Security{}, brokers)
	if err != nil {
		t.Fatal(err)
	}
	name := testinfra.Name("ensure")
	too := kafkautil.Replication{Factor: len(cluster.Brokers) + 1, MinISR: 1}
	if _, err := kafkautil.EnsureTopics(ctx, kafkautil.Security{}, brokers, kafkautil.TopicSpec{Partitions: 1, Replication: too}, name); err == nil {
		deleteTopics(t, brokers, name)
		t.Fatalf("EnsureTopics created %s with factor %d on %d brokers", name, too.Factor, len(cluster.Brokers))
	}
}

// readReplication reads a topic's replication factor from its partitions'
// replicas and its min.insync.replicas from the broker's configuration.
func readReplication(t *testing.T, ctx context.Context, brokers []string, topic string) kafkautil.Replication {
	t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}} // not the shared transport, whose metadata cache may predate the topic
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil || len(md.Topics) != 1 || len(md.Topics[0].Partitions) == 0 {
		t.Fatalf("metadata of %s: %v %+v", topic, err, md)
	}
	var r kafkautil.Replication
	r.Factor = len(md.Topics[0].Partitions[0].Replicas)
	// The broker asked may learn of a new topic a moment after the
	// controller created it.
	var cfg *kafka.DescribeConfigsResponse
	testinfra.WaitFor(t, 10*time.Second, "min.insync.replicas of "+topic, func() (bool, error) {
		var err error
		cfg, err = describeMinISR(ctx, client, topic)
		return err == nil, nil
	})
	r.MinISR, err = strconv.Atoi(cfg.Resources[0].ConfigEntries[0].ConfigValue)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func deleteTopics(t *testing.T, brokers []string, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}} // not the shared transport, whose metadata cache may predate the topic
	if _, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: names}); err != nil {
		t.Logf("deleting %v: %v", names, err)
	}
}

// describeMinISR reads a topic's min.insync.replicas; an error inside the
// answer (the broker does not know the topic yet) is returned as err.
func describeMinISR(ctx context.Context, client *kafka.Client, topic string) (*kafka.DescribeConfigsResponse, error) {
	cfg, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"min.insync.replicas"},
	}}})
	switch {
	case err != nil:
		return nil, err
	case len(cfg.Resources) != 1:
		return nil, fmt.Errorf("%d resources in the answer", len(cfg.Resources))
	case cfg.Resources[0].Error != nil:
		return nil, cfg.Resources[0].Error
	case len(cfg.Resources[0].ConfigEntries) != 1:
		return nil, fmt.Errorf("%d entries in the answer", len(cfg.Resources[0].ConfigEntries))
	}
	return cfg, nil
}

func TestClusterUnlisted(t *testing.T) {
	t.Parallel()
	three := kafkautil.Cluster{Size: 3, Brokers: []kafka.Broker{
		{ID: 1, Host: "10.0.0.1", Port: 9092}, {ID: 2, Host: "10.0.0.2", Port: 9092}, {ID: 3, Host: "10.0.0.3", Port: 9092}}}
	down := kafkautil.Cluster{Size: 3, Brokers: three.Brokers[:2]} // broker 3 down, holding replicas
	for _, tc := range []struct {
		name         string
		c            kafkautil.Cluster
		listed       []string
		wantUnlisted int
		wantShort    bool
	}{
		{"every broker", three, []string{"10.0.0.1:9092", "10.0.0.2:9092", "10.0.0.3:9092"}, 0, false},
		{"one of three", three, []string{"10.0.0.1:9092"}, 2, true},
		{"one named twice", three, []string{"10.0.0.1:9092", "10.0.0.1:9092"}, 2, true},
		{"two of three, the third down", down, []string{"10.0.0.1:9092", "10.0.0.2:9092"}, 0, true},
		{"every broker, one down", down, []string{"10.0.0.1:9092", "10.0.0.2:9092", "10.0.0.3:9092"}, 0, false},
		{"an alias for three", three, []string{"kafka.internal:9092"}, 3, true},
	} {
		unlisted, short := tc.c.Unlisted(tc.listed)
		if len(unlisted) != tc.wantUnlisted || short != tc.wantShort {
			t.Errorf("%s: Unlisted(%v) = %v, %v; want %d unlisted, short %v", tc.name, tc.listed, unlisted, short, tc.wantUnlisted, tc.wantShort)
		}
	}
}
