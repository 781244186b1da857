package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// ensure-topics without replication flags gives new topics the cluster's
// replication: min(3, brokers) copies and min.insync.replicas min(2, that),
// read back from the broker. On the dev stack's single broker that is 1 and
// 1; on a cluster of three (ONCEFLOW_TEST_KAFKA_BROKERS naming it) 3 and 2,
// where a hard-coded factor of 1 left every topic on one broker.
func TestEnsureTopicsReplicatesAsTheClusterAllows(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	brokers := testinfra.KafkaBrokers(t)
	cluster, err := kafkautil.DescribeCluster(ctx, kafkautil.Security{}, brokers)
	if err != nil {
		t.Fatal(err)
	}
	want := kafkautil.ReplicationFor(cluster.Size)
	name := testinfra.Name("kafkactl")
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}} // not the shared transport, whose metadata cache may predate the topic
	t.Cleanup(func() {
		_, _ = client.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{name}})
	})
	var out bytes.Buffer
	if err := run(ctx, []string{"kafkactl", "ensure-topics", "-brokers", strings.Join(brokers, ","), "-partitions", "2", name}, nil, &out); err != nil {
		t.Fatalf("ensure-topics: %v\n%s", err, out.String())
	}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{name}})
	if err != nil || len(md.Topics) != 1 || len(md.Topics[0].Partitions) != 2 {
		t.Fatalf("metadata of %s: %v %+v", name, err, md)
	}
	for _, p := range md.Topics[0].Partitions {
		if len(p.Replicas) != want.Factor {
			t.Errorf("%s/%d has %d replicas on a cluster of %d, want %d", name, p.ID, len(p.Replicas), cluster.Size, want.Factor)
		}
	}
	// The broker asked may learn of a new topic a moment after the
	// controller created it.
	var cfg *kafka.DescribeConfigsResponse
	testinfra.WaitFor(t, 10*time.Second, "min.insync.replicas of "+name, func() (bool, error) {
		var err error
		cfg, err = describeMinISR(ctx, client, name)
		return err == nil, nil
	})
	if got := cfg.Resources[0].ConfigEntries[0].ConfigValue; got != strconv.Itoa(want.MinISR) {
		t.Errorf("%s has min.insync.replicas %s on a cluster of %d, want %d", name, got, cluster.Size, want.MinISR)
	}
	if !strings.Contains(out.String(), "replication factor") {
		t.Errorf("ensure-topics did not say how it replicated %s:\n%s", name, out.String())
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
