// Package kafkautil builds segmentio/kafka-go clients with the settings the
// outbox and inbox rely on, instead of kafka-go's unsafe zero values.
package kafkautil

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/segmentio/kafka-go"
)

// Writer is a *kafka.Writer whose Close also closes the connections and the
// metadata refresh of the transport it owns.
type Writer struct {
	*kafka.Writer
	transport *kafka.Transport
}

// KafkaWriter returns the kafka-go writer w wraps: the outbox relay reads its
// batch limits to cut its writes (outbox.Writer).
func (w *Writer) KafkaWriter() *kafka.Writer { return w.Writer }

// Close flushes and closes the writer, then its transport.
func (w *Writer) Close() error {
	err := w.Writer.Close()
	w.transport.CloseIdleConnections()
	return err
}

// RelayBatchSize is the batchSize of the outbox relays' writers. The relay
// cuts its writes to fit one record batch per partition (outbox.Writer), so
// the size only bounds how much of a backlog one write takes; 500, the
// relay's batch, made kafka-go allocate 76 KB per partition per write, a
// third of what the services allocated at 1,000 orders/s (issue 23).
const RelayBatchSize = 100

// NewWriter returns a writer that waits for every in-sync replica to ack
// (a Writer{} literal defaults to fire-and-forget), flushes after a fraction
// of a millisecond instead of kafka-go's default second (callers write whole
// batches, so a longer wait only adds latency; see BENCHMARKS.md), and picks
// partitions by hashing the key so each aggregate stays on one partition.
//
// The hash is murmur2 with the Java client's semantics
// (toPositive(murmur2(key)) % partitions over all of the topic's partitions),
// the partitioner of Kafka's Java producer and so of Kafka Connect, Debezium
// and Kafka Streams: the same key lands on the same partition whoever
// publishes it (DESIGN.md invariant 10; testdata/java-partitions.tsv holds
// the Java client's own answers). kafka-go's default, FNV-1a, agrees with
// none of them.
//
// batchSize caps the messages of one partition in one record batch; kafka-go
// also allocates room for that many messages for each partition of every
// write, however few it holds, so a caller that writes a few messages per
// partition at a time (a relay at a steady rate) should keep it small:
// RelayBatchSize. WithSecurity adds TLS and SASL.
func NewWriter(brokers []string, batchSize int, opts ...WriterOption) *Writer {
	if batchSize < 1 {
		batchSize = 100
	}
	var o writerOptions
	for _, opt := range opts {
		opt(&o)
	}
	// A transport of its own: kafka.DefaultTransport is shared by every
	// writer in the process and caches topic metadata, so a topic created
	// after another writer looked would stay unknown for seconds.
	transport := o.security.Transport()
	return &Writer{transport: transport, Writer: &kafka.Writer{
		Addr: kafka.TCP(brokers...),
		// Not Consistent: a nil key gets any partition, as in Java (our
		// events always have a key; an empty one is hashed, as in Java).
		Balancer:     &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    batchSize,
		BatchTimeout: 200 * time.Microsecond,
		// Writes that fail are retried by the caller (the outbox relay keeps
		// the row pending), so kafka-go's own retries only add latency.
		MaxAttempts:            3,
		WriteBackoffMin:        10 * time.Millisecond,
		WriteBackoffMax:        200 * time.Millisecond,
		AllowAutoTopicCreation: false,
		Transport:              transport,
	}}
}

// Ping reports whether a broker answers a metadata request within the
// deadline of ctx (or 3 seconds).
func Ping(ctx context.Context, brokers []string) error {
	return PingWith(ctx, Security{}, brokers)
}

// PingWith is Ping connecting with s (TLS, SASL).
func PingWith(ctx context.Context, s Security, brokers []string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
	}
	var lastErr error
	d := s.Dialer()
	for _, b := range brokers {
		conn, err := d.DialContext(ctx, "tcp", b)
		if err != nil {
			lastErr = err
			continue
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(dl)
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
// go to, over PLAINTEXT (the dev stack's and the test rigs'; see ControllerWith).
func Controller(ctx context.Context, brokers []string) (*kafka.Conn, error) {
	return ControllerWith(ctx, Security{}, brokers)
}

// ControllerWith is Controller connecting with s (TLS, SASL), both to the
// first broker and to the controller it names.
func ControllerWith(ctx context.Context, s Security, brokers []string) (*kafka.Conn, error) {
	d := s.Dialer()
	conn, err := d.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", brokers[0], err)
	}
	defer conn.Close()
	c, err := conn.Controller()
	if err != nil {
		return nil, fmt.Errorf("finding the controller: %w", err)
	}
	ctrl, err := d.DialContext(ctx, "tcp", net.JoinHostPort(c.Host, fmt.Sprint(c.Port)))
	if err != nil {
		return nil, fmt.Errorf("dialing the controller: %w", err)
	}
	return ctrl, nil
}

// NewGroupReader returns a consumer-group reader that starts a new group at
// the oldest message, polls with a short wait, and commits offsets in the
// background every 100ms. Callers commit a message only after its database
// transaction committed; a crash loses at most 100ms of offset commits, which
// are redelivered and absorbed by the inbox. Close flushes pending commits.
// It connects over PLAINTEXT; NewGroupReaderWith adds TLS and SASL.
func NewGroupReader(brokers []string, topic, group string) *kafka.Reader {
	return NewGroupReaderWith(Security{}, brokers, topic, group)
}

// NewGroupReaderWith is NewGroupReader connecting with s (TLS, SASL).
func NewGroupReaderWith(s Security, brokers []string, topic, group string) *kafka.Reader {
	return kafka.NewReader(kafka.ReaderConfig{
		Dialer:            s.Dialer(),
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
