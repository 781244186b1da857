package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/testenv"
)

// A test's topic is replicated as the cluster allows: min(3, brokers)
// copies, min.insync.replicas min(2, that). On one broker that is 1 and 1;
// on a cluster of three (ONCEFLOW_TEST_KAFKA_BROKERS naming it) the kits'
// topics get 3 and 2, so a test there writes with acks=all as production
// does instead of to a single copy. A setting the test names is kept.
func TestNewTopicIsReplicatedAsTheClusterAllows(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}} // not the shared transport, whose metadata cache may predate the topic
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	factor := min(3, len(md.Brokers))
	wantISR := map[bool]string{true: "2", false: "1"}[factor >= 2]

	topic := testenv.NewTopic(t, brokers, 2)
	named := testenv.Name("test")
	testenv.NewTopicNamed(t, brokers, named, 1, kafka.ConfigEntry{ConfigName: "min.insync.replicas", ConfigValue: "1"})

	// A transport of its own again: kafka-go's answers metadata from the
	// cluster state it cached, which has neither topic.
	fresh := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	md, err = fresh.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic, named}})
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Topics) != 2 {
		t.Fatalf("metadata of %s and %s: %+v", topic, named, md.Topics)
	}
	for _, tp := range md.Topics {
		if len(tp.Partitions) == 0 {
			t.Errorf("metadata of %s has no partitions: %v", tp.Name, tp.Error)
		}
		for _, p := range tp.Partitions {
			if len(p.Replicas) != factor {
				t.Errorf("%s/%d has %d replicas on %d brokers, want %d", tp.Name, p.ID, len(p.Replicas), len(md.Brokers), factor)
			}
		}
	}
	for name, want := range map[string]string{topic: wantISR, named: "1"} {
		// The broker asked may learn of a new topic a moment after the
		// controller created it.
		var got string
		testenv.WaitFor(t, 10*time.Second, "min.insync.replicas of "+name, func() (bool, error) {
			cfg, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
				ResourceType: kafka.ResourceTypeTopic, ResourceName: name, ConfigNames: []string{"min.insync.replicas"},
			}}})
			if err != nil || len(cfg.Resources) != 1 || len(cfg.Resources[0].ConfigEntries) != 1 {
				return false, nil
			}
			got = cfg.Resources[0].ConfigEntries[0].ConfigValue
			return true, nil
		})
		if got != want {
			t.Errorf("%s has min.insync.replicas %s, want %s", name, got, want)
		}
	}
}
