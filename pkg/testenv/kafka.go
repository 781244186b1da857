package testenv

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/kafkasafe"
)

// Ping reports whether a broker answers a metadata request within the
// deadline of ctx (or 3 seconds).
func Ping(ctx context.Context, brokers []string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
	}
	var lastErr error
	for _, b := range brokers {
		conn, err := kafka.DialContext(ctx, "tcp", b)
		if err != nil {
			lastErr = err
			continue
		}
		_, err = conn.Brokers()
		conn.Close()
		if err == nil {
			return nil
		}
		lastErr = err
	}
	return fmt.Errorf("no Kafka broker of %v answered: %w", brokers, lastErr)
}

// Controller dials the cluster's controller, which topic admin requests must
// go to.
func Controller(ctx context.Context, brokers []string) (*kafka.Conn, error) {
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", brokers[0], err)
	}
	defer conn.Close()
	c, err := conn.Controller()
	if err != nil {
		return nil, fmt.Errorf("finding the controller: %w", err)
	}
	return kafka.DialContext(ctx, "tcp", net.JoinHostPort(c.Host, fmt.Sprint(c.Port)))
}

// TopicConfig is how the test kits create a topic on the cluster ctrl
// belongs to: replicated min(3, brokers) times with min.insync.replicas
// min(2, that), so a test against a cluster (ONCEFLOW_TEST_KAFKA_BROKERS
// naming its brokers) writes with acks=all as production does, and a test
// against one broker gets the 1 and 1 it can hold. It is
// kafkasafe.ReplicationFor's rule. configs are further topic settings;
// one naming min.insync.replicas replaces the default.
func TopicConfig(ctrl *kafka.Conn, name string, partitions int, configs ...kafka.ConfigEntry) (kafka.TopicConfig, error) {
	brokers, err := ctrl.Brokers()
	if err != nil {
		return kafka.TopicConfig{}, fmt.Errorf("reading the cluster's brokers: %w", err)
	}
	repl := kafkasafe.ReplicationFor(len(brokers))
	entries := slices.Clone(configs)
	if !slices.ContainsFunc(configs, func(c kafka.ConfigEntry) bool { return c.ConfigName == "min.insync.replicas" }) {
		entries = append(entries, kafka.ConfigEntry{ConfigName: "min.insync.replicas", ConfigValue: strconv.Itoa(repl.MinISR)})
	}
	return kafka.TopicConfig{Topic: name, NumPartitions: partitions, ReplicationFactor: repl.Factor, ConfigEntries: entries}, nil
}

// Writer is the libraries' writer (kafkasafe.Writer): its Close also
// closes its transport, so tests that make many writers leave nothing
// running.
type Writer = kafkasafe.Writer

// NewWriter returns the writer the libraries expect, kafkasafe.NewWriter
// (batchSize at least the messages written at once): the one production
// uses, so a test cannot pass with a writer production would not have.
func NewWriter(brokers []string, batchSize int) *Writer {
	return kafkasafe.NewWriter(brokers, kafkasafe.WriterConfig{BatchSize: batchSize})
}

// NewGroupReader returns a consumer-group reader that starts a new group at
// the oldest message and commits in the background every 100ms.
func NewGroupReader(brokers []string, topic, group string) *kafka.Reader {
	return kafka.NewReader(kafka.ReaderConfig{
		Brokers:           brokers,
		Topic:             topic,
		GroupID:           group,
		StartOffset:       kafka.FirstOffset,
		MinBytes:          1,
		MaxBytes:          10 << 20,
		MaxWait:           50 * time.Millisecond,
		ReadBackoffMin:    10 * time.Millisecond,
		ReadBackoffMax:    100 * time.Millisecond,
		CommitInterval:    100 * time.Millisecond,
		HeartbeatInterval: time.Second,
		SessionTimeout:    10 * time.Second,
		RebalanceTimeout:  10 * time.Second,
	})
}

// ReadEvents reads topic from its start, in a consumer group of its own, on
// a goroutine until the test ends, and calls handle with each message's
// event, in order within each partition. An undecodable message fails the
// test and stops the reading.
func ReadEvents(t testing.TB, brokers []string, topic string, handle func(event.Envelope)) {
	t.Helper()
	r := NewGroupReader(brokers, topic, Name("reader"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				return
			}
			ev, err := event.FromKafka(m)
			if err != nil {
				t.Errorf("undecodable message at offset %d of %s: %v", m.Offset, topic, err)
				return
			}
			handle(ev)
		}
	}()
	t.Cleanup(func() { cancel(); <-done; r.Close() })
}

// Recorder is an in-memory Kafka writer that records every message written
// to it, in order: the test kits' stand-in for a topic (outboxtest.Writer,
// inboxtest's dead letters). The zero value is ready to use and safe for
// concurrent use.
type Recorder struct {
	mu   sync.Mutex
	msgs []kafka.Message
}

// WriteMessages records msgs.
func (r *Recorder) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msgs...)
	return nil
}

// Messages returns a copy of what was written so far, in order.
func (r *Recorder) Messages() []kafka.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]kafka.Message(nil), r.msgs...)
}
