// Package kafkautil builds segmentio/kafka-go clients with the settings the
// outbox and inbox rely on, instead of kafka-go's unsafe zero values.
package kafkautil

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/kafkasafe"
)

// Writer is the libraries' writer (kafkasafe.Writer): its Close also
// closes the connections and the metadata refresh of the transport it owns,
// and KafkaWriter hands the outbox relay the writer whose batch limits cut
// its writes (outbox.Writer).
type Writer = kafkasafe.Writer

// RelayBatchSize is the batchSize of the outbox relays' writers. The relay
// cuts its writes to fit one record batch per partition (outbox.Writer), so
// the size only bounds how much of a backlog one write takes; 500, the
// relay's batch, made kafka-go allocate 76 KB per partition per write, a
// third of what the services allocated at 1,000 orders/s (issue 23).
const RelayBatchSize = kafkasafe.DefaultBatchSize

// NewWriter returns the libraries' writer, kafkasafe.NewWriter, which the
// outbox relay and the inbox accept (acks from every in-sync replica, a
// fraction of a millisecond's batch timeout, murmur2 keys as Kafka's Java
// producer: testdata/java-partitions.tsv holds the Java client's own
// answers), connecting over PLAINTEXT unless WithSecurity adds TLS and SASL.
//
// batchSize caps the messages of one partition in one record batch; kafka-go's
// writer (which takes the writes kafkasafe.Writer does not send itself)
// allocates room for that many messages for each partition of every write,
// however few it holds, so a caller that writes a few messages per
// partition at a time (a relay at a steady rate) should keep it small:
// RelayBatchSize.
func NewWriter(brokers []string, batchSize int, opts ...WriterOption) *Writer {
	var o writerOptions
	for _, opt := range opts {
		opt(&o)
	}
	return kafkasafe.NewWriter(brokers, kafkasafe.WriterConfig{BatchSize: batchSize, Transport: o.security.Transport()})
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
