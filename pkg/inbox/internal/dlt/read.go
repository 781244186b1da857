package dlt

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// Reading a dead-letter topic, for inboxadmin's ListDeadLetters and
// RequeueDeadLetters (and its metadata, for the consumer's check at start):
// plain partition readers from each partition's first offset up to its
// high-water mark, with no consumer group and no committed offset, so a
// read changes nothing and can be repeated.

// readIdleTimeout bounds the wait for the next message of a partition that
// still has messages below its high-water mark, so a gap at the end of a
// partition (a compacted or aborted record) fails the listing instead of
// hanging it.
const readIdleTimeout = 10 * time.Second

// ReadTopic calls visit with every message of topic, partition by
// partition, each from its first offset up to the high-water mark it had
// when reading began. visit returns false to skip the rest of the partition.
func ReadTopic(ctx context.Context, dialer *kafka.Dialer, brokers []string, topic string, visit func(partition int, m kafka.Message) (bool, error)) error {
	partitions, err := TopicPartitions(ctx, dialer, brokers, topic)
	if err != nil {
		return err
	}
	for _, p := range partitions {
		first, last, err := PartitionOffsets(ctx, dialer, brokers, p)
		if err != nil {
			return err
		}
		if first >= last {
			continue
		}
		if err := ReadPartition(ctx, dialer, brokers, p, first, last, visit); err != nil {
			return err
		}
	}
	return nil
}

// TopicPartitions reads the partitions of topic, in id order, with a
// metadata request that does not ask the broker to create a missing topic
// (kafka.Conn.ReadPartitions does), and does not retry an unknown topic until
// ctx ends (kafka.Dialer.LookupPartitions does). The client's transport
// takes dialer's TLS and SASL, so metadata goes the way the reads go.
func TopicPartitions(ctx context.Context, dialer *kafka.Dialer, brokers []string, topic string) ([]kafka.Partition, error) {
	transport := &kafka.Transport{DialTimeout: dialer.Timeout, TLS: dialer.TLS, SASL: dialer.SASLMechanism}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: transport, Timeout: 10 * time.Second}
	res, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("inbox: reading the partitions of %s: %w", topic, err)
	}
	if len(res.Topics) != 1 {
		return nil, fmt.Errorf("inbox: reading the partitions of %s: the broker described %d topics", topic, len(res.Topics))
	}
	if err := res.Topics[0].Error; err != nil {
		return nil, fmt.Errorf("inbox: reading the partitions of %s: %w", topic, err)
	}
	partitions := res.Topics[0].Partitions
	for _, p := range partitions {
		if p.Error != nil {
			return nil, fmt.Errorf("inbox: reading the partitions of %s: partition %d: %w", topic, p.ID, p.Error)
		}
	}
	slices.SortFunc(partitions, func(a, b kafka.Partition) int { return cmp.Compare(a.ID, b.ID) })
	return partitions, nil
}

// PartitionOffsets returns the first offset of p and its high-water mark,
// from p's leader (DialPartition is DialLeader without a second metadata
// lookup). A partition whose leader is moving, or was only just elected,
// answers with a temporary error for a moment: those are retried a few
// times, with the leader looked up afresh.
func PartitionOffsets(ctx context.Context, dialer *kafka.Dialer, brokers []string, p kafka.Partition) (first, last int64, err error) {
	const attempts = 5
	for attempt := 1; ; attempt++ {
		first, last, err = readOffsets(ctx, dialer, p)
		var kerr kafka.Error
		if err == nil || attempt == attempts || !errors.As(err, &kerr) || !kerr.Temporary() {
			break
		}
		if !retry.Sleep(ctx, time.Duration(attempt)*100*time.Millisecond) {
			return 0, 0, fmt.Errorf("inbox: reading the offsets of %s/%d: %w", p.Topic, p.ID, ctx.Err())
		}
		partitions, perr := TopicPartitions(ctx, dialer, brokers, p.Topic)
		if perr == nil && p.ID < len(partitions) {
			p = partitions[p.ID]
		}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("inbox: reading the offsets of %s/%d: %w", p.Topic, p.ID, err)
	}
	return first, last, nil
}

func readOffsets(ctx context.Context, dialer *kafka.Dialer, p kafka.Partition) (first, last int64, err error) {
	conn, err := dialer.DialPartition(ctx, "tcp", "", p)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	return conn.ReadOffsets()
}

// ReadPartition calls visit with the messages of p from offset start up to
// end, until visit returns false.
func ReadPartition(ctx context.Context, dialer *kafka.Dialer, brokers []string, p kafka.Partition, start, end int64,
	visit func(int, kafka.Message) (bool, error)) error {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:        brokers,
		Topic:          p.Topic,
		Partition:      p.ID,
		Dialer:         dialer,
		StartOffset:    kafka.FirstOffset,
		MinBytes:       1,
		MaxBytes:       10 << 20,
		MaxWait:        100 * time.Millisecond,
		ReadBackoffMin: 10 * time.Millisecond,
		ReadBackoffMax: 100 * time.Millisecond,
	})
	defer r.Close()
	if err := r.SetOffset(start); err != nil {
		return fmt.Errorf("inbox: reading %s/%d from %d: %w", p.Topic, p.ID, start, err)
	}
	for {
		readCtx, cancel := context.WithTimeout(ctx, readIdleTimeout)
		m, err := r.ReadMessage(readCtx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("no message for %v below the high-water mark %d", readIdleTimeout, end)
			}
			return fmt.Errorf("inbox: reading %s/%d: %w", p.Topic, p.ID, err)
		}
		more, err := visit(p.ID, m)
		if err != nil {
			return err
		}
		if !more || m.Offset+1 >= end {
			return nil
		}
	}
}
