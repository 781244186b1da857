package kafkautil

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// EndOffsets returns the end offset (the next offset to be written) of each
// of topic's partitions, asking through client.
func EndOffsets(ctx context.Context, client *kafka.Client, topic string, partitions []int) (map[int]int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, p := range partitions {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p))
	}
	resp, err := client.ListOffsets(ctx, req)
	if err != nil {
		return nil, err
	}
	ends := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		ends[p.Partition] = p.LastOffset
	}
	return ends, nil
}

// ReadRange reads each partition p's records of topic from offset from[p]
// (0 or none: from its first record) up to, not including, to[p], giving each partition at most timeout.
// maxBytes bounds one fetch (0: kafka-go's 1 MiB); a record larger than it
// is never read.
func ReadRange(ctx context.Context, brokers []string, topic string, from, to map[int]int64, maxBytes int, timeout time.Duration) ([]kafka.Message, error) {
	var out []kafka.Message
	for p, end := range to {
		msgs, err := readPartition(ctx, brokers, topic, p, from[p], end, maxBytes, timeout)
		if err != nil {
			return nil, err
		}
		out = append(out, msgs...)
	}
	return out, nil
}

func readPartition(ctx context.Context, brokers []string, topic string, p int, start, end int64, maxBytes int, timeout time.Duration) ([]kafka.Message, error) {
	if end <= start {
		return nil, nil
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond, MaxBytes: maxBytes})
	defer r.Close()
	if start > 0 { // 0: from the partition's first record, whatever its offset
		if err := r.SetOffset(start); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var out []kafka.Message
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading %s/%d at %d: %w", topic, p, start, err)
		}
		out = append(out, m)
		if m.Offset >= end-1 {
			return out, nil
		}
	}
}
