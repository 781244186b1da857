package kafkautil_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// TestWaitTopicsReady creates topics and, without any other wait, asks
// WaitTopicsReady for them: once it returns, every partition's leader must
// answer ListOffsets, which is what a consumer's first fetch needs.
func TestWaitTopicsReady(t *testing.T) {
	t.Parallel()
	brokers := testinfra.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := []string{testinfra.Name("ready"), testinfra.Name("ready")}
	ctrl, err := kafkautil.Controller(ctx, brokers)
	if err != nil {
		t.Fatalf("dialing the controller: %v", err)
	}
	defer ctrl.Close()
	if err := ctrl.CreateTopics(kafka.TopicConfig{Topic: names[0], NumPartitions: 6, ReplicationFactor: 1},
		kafka.TopicConfig{Topic: names[1], NumPartitions: 3, ReplicationFactor: 1}); err != nil {
		t.Fatalf("creating topics: %v", err)
	}
	t.Cleanup(func() { _ = ctrl.DeleteTopics(names...) })

	if err := kafkautil.WaitTopicsReady(ctx, brokers, names...); err != nil {
		t.Fatalf("WaitTopicsReady: %v", err)
	}
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for i, n := range []int{6, 3} {
		for p := range n {
			req.Topics[names[i]] = append(req.Topics[names[i]], kafka.FirstOffsetOf(p))
		}
	}
	resp, err := client.ListOffsets(ctx, req)
	if err != nil {
		t.Fatalf("ListOffsets right after WaitTopicsReady: %v", err)
	}
	for topic, parts := range resp.Topics {
		for _, p := range parts {
			if p.Error != nil {
				t.Errorf("%s/%d right after WaitTopicsReady: %v", topic, p.Partition, p.Error)
			}
		}
	}
}

// TestWaitTopicsReadyMissingTopic: a topic that does not exist is never
// ready, and the wait ends with ctx, saying why.
func TestWaitTopicsReadyMissingTopic(t *testing.T) {
	t.Parallel()
	brokers := testinfra.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := kafkautil.WaitTopicsReady(ctx, brokers, testinfra.Name("never-created"))
	if err == nil {
		t.Fatal("WaitTopicsReady returned nil for a topic that does not exist")
	}
	t.Logf("as expected: %v", err)
}
