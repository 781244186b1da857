package kafkasafe_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/kafkasafe"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// EnsureTopics with DeadLetters creates each topic and its dead-letter
// topic beside it, replicated as the cluster allows, with
// min.insync.replicas set; a second call creates nothing and leaves what
// exists alone. MissingTopics sees the difference without creating anything.
func TestEnsureTopicsWithDeadLetters(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{MetadataTTL: time.Second}}
	name := testenv.Name("safe")
	dlt := name + kafkasafe.DeadLetterSuffix
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{name, dlt}})
	})

	missing, err := kafkasafe.MissingTopics(ctx, client, name, dlt)
	if err != nil || !slices.Equal(missing, []string{name, dlt}) {
		t.Fatalf("MissingTopics before = %v, %v; want both", missing, err)
	}
	states, err := kafkasafe.EnsureTopics(ctx, client, kafkasafe.TopicSpec{Partitions: 3, DeadLetters: true}, name)
	if err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	if len(states) != 2 || states[0].Name != name || states[1].Name != dlt || !states[0].Created || !states[1].Created {
		t.Fatalf("EnsureTopics reported %+v, want %s and %s created", states, name, dlt)
	}
	want := states[0].Replication
	if want.Factor < 1 || want.MinISR < 1 {
		t.Fatalf("EnsureTopics created with %+v", want)
	}
	testenv.WaitFor(t, 20*time.Second, "both topics to be known", func() (bool, error) {
		missing, err := kafkasafe.MissingTopics(ctx, client, name, dlt)
		return err == nil && len(missing) == 0, nil
	})
	cfg, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: dlt, ConfigNames: []string{"min.insync.replicas"},
	}}})
	if err != nil || len(cfg.Resources) != 1 || len(cfg.Resources[0].ConfigEntries) != 1 {
		t.Fatalf("describing %s: %+v, %v", dlt, cfg, err)
	}
	if got := cfg.Resources[0].ConfigEntries[0].ConfigValue; got != strconv.Itoa(want.MinISR) {
		t.Errorf("%s has min.insync.replicas %s, want %d", dlt, got, want.MinISR)
	}

	again, err := kafkasafe.EnsureTopics(ctx, client, kafkasafe.TopicSpec{Partitions: 6, DeadLetters: true}, name)
	if err != nil || len(again) != 2 || again[0].Created || again[1].Created || again[1].Partitions != 3 {
		t.Errorf("EnsureTopics again = %+v, %v; want both left as they are (3 partitions)", again, err)
	}
}

// NewWriter's writer passes CheckWriter, writes with acks from every
// in-sync replica, and puts a key on the partition Kafka's Java producer
// picks (rows of platform/kafkautil/testdata/java-partitions.tsv, produced
// by kafka-clients 3.9.1 itself): a relay and a Java producer writing one
// aggregate keep it on one partition. kafka-go's bare writer fails the check
// on each setting.
func TestNewWriterIsSafe(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 6)
	w := kafkasafe.NewWriter(brokers, kafkasafe.WriterConfig{})
	defer w.Close()
	if err := kafkasafe.CheckWriter(w); err != nil {
		t.Fatalf("CheckWriter(NewWriter) = %v", err)
	}
	bare := &kafka.Writer{Addr: kafka.TCP(brokers...)}
	defer bare.Close()
	err := kafkasafe.CheckWriter(bare)
	for _, want := range []string{"RequiredAcks", "BatchTimeout", "Balancer"} {
		testenv.CheckErr(t, err, want)
	}

	java := map[string]int{"616263": 3, "61626364": 2, "6162636465": 1, "616263646566": 0, "6f726465722d31": 4}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var msgs []kafka.Message
	for k := range java {
		key, _ := hex.DecodeString(k)
		msgs = append(msgs, kafka.Message{Topic: topic, Key: key, Value: []byte(k)})
	}
	// The new topic's leaders take a moment to be known; a retried write
	// may duplicate a message, which lands on the same partition.
	testenv.WaitFor(t, 20*time.Second, "the new topic to take writes", func() (bool, error) {
		return w.WriteMessages(ctx, msgs...) == nil, nil
	})
	start := time.Now()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	// kafka-go's default BatchTimeout alone would take a second.
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Errorf("writing %d messages took %s", len(msgs), took)
	}
	for p := range 6 {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		end, err := r.ReadLag(ctx)
		for i := int64(0); err == nil && i < end; i++ {
			var m kafka.Message
			if m, err = r.ReadMessage(ctx); err == nil && java[string(m.Value)] != p {
				t.Errorf("key %s landed on partition %d, Kafka's Java producer picks %d", m.Value, p, java[string(m.Value)])
			}
		}
		r.Close()
		if err != nil {
			t.Fatalf("reading partition %d: %v", p, err)
		}
	}
}

// Writer.WriteMessages sends a write whose partitions each fit one record
// batch as produce requests of its own, and answers as kafka-go's writer
// does: a message the topic refuses (over its max.message.bytes) fails
// alone in a kafka.WriteErrors, its batch-mates on other partitions are
// written; a message over BatchBytes is a kafka.MessageTooLargeError naming
// it; a write after Close is io.ErrClosedPipe.
func TestWriterAnswersAsKafkaGo(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Name("safe")
	testenv.NewTopicNamed(t, brokers, topic, 6, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "2048"})
	w := kafkasafe.NewWriter(brokers, kafkasafe.WriterConfig{})
	w.BatchBytes = 64 << 10
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	small := func(key string) kafka.Message {
		return kafka.Message{Topic: topic, Key: []byte(key), Value: []byte("v")}
	}
	testenv.WaitFor(t, 20*time.Second, "the new topic to take writes", func() (bool, error) {
		return w.WriteMessages(ctx, small("abc")) == nil, nil
	})

	// "abc" and "abcd" land on partitions 3 and 2 (TestNewWriterIsSafe).
	big := kafka.Message{Topic: topic, Key: []byte("abcd"), Value: make([]byte, 4096)}
	err := w.WriteMessages(ctx, small("abc"), big)
	var we kafka.WriteErrors
	if !errors.As(err, &we) || len(we) != 2 || we[0] != nil || !errors.Is(we[1], kafka.MessageSizeTooLarge) {
		t.Fatalf("writing a message the topic refuses beside one it takes = %v, want WriteErrors [nil, %v]", err, kafka.MessageSizeTooLarge)
	}

	huge := kafka.Message{Topic: topic, Key: []byte("abcd"), Value: make([]byte, 128<<10)}
	var tooLarge kafka.MessageTooLargeError
	if err := w.WriteMessages(ctx, small("abc"), huge); !errors.As(err, &tooLarge) || !bytes.Equal(tooLarge.Message.Value, huge.Value) {
		t.Fatalf("writing a message over BatchBytes = %v, want a kafka.MessageTooLargeError naming it", err)
	}

	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteMessages(ctx, small("abc")); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("writing after Close = %v, want %v", err, io.ErrClosedPipe)
	}
}
