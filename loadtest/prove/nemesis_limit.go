package prove

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// The limit fault: the orders topic's max.message.bytes lowered for a
// while, an operator's misconfiguration the broker answers with a message
// error.

// limitRestoreFor bounds how long the limit's restore is tried: another
// step may have Kafka stopped (up to 30 s) or restarting meanwhile.
const limitRestoreFor = 3 * time.Minute

// limit lowers the orders topic's max.message.bytes, for hold, to between
// the record-batch sizes of OrderCancelled and OrderPlaced as the topic
// holds them now: the broker answers MESSAGE_TOO_LARGE, a message error,
// for every OrderPlaced written alone, while an OrderCancelled alone still
// passes. A batch holding both of one order is refused whole, and the
// relay then writes each alone.
//
// The setting is put back whatever happens meanwhile: with SEED=585555 a
// Kafka restart 2.4 s into a 6 s hold refused the restore, nothing tried it
// again, and the topic refused every OrderPlaced until the end of the run
// (774 dead after the end-of-run requeues). So the restore, and a lowering
// that failed (it may have reached the broker all the same), are retried
// until the broker reports the topic on its default.
func (n *nemesisRun) limit(ctx context.Context, d time.Duration) (string, error) {
	p := n.p
	msgs, err := readTopic(ctx, n.h.stack.Brokers(), p.OrdersTopic)
	if err != nil {
		return "", err
	}
	minPlaced, maxCancelled := 0, 0
	for _, m := range msgs {
		size := recordBatchSize(m)
		switch headerValue(m, "event-type") {
		case "OrderPlaced":
			if minPlaced == 0 || size < minPlaced {
				minPlaced = size
			}
		case "OrderCancelled":
			maxCancelled = max(maxCancelled, size)
		}
	}
	if minPlaced == 0 || maxCancelled == 0 || minPlaced <= maxCancelled+1 {
		return fmt.Sprintf("skipped: cannot put a limit between OrderCancelled (%d bytes) and OrderPlaced (%d bytes)", maxCancelled, minPlaced), nil
	}
	limit := maxCancelled + (minPlaced-maxCancelled)/2
	n.limited.Store(true)
	lowerErr := n.alterMaxMessageBytes(ctx, kafka.ConfigOperationSet, strconv.Itoa(limit))
	if lowerErr == nil {
		hold(ctx, d)
	}
	took, err := n.restoreLimit(context.WithoutCancel(ctx))
	detail := fmt.Sprintf("max.message.bytes=%d for %.1fs (OrderCancelled up to %d bytes, OrderPlaced from %d), restored in %.1fs",
		limit, d.Seconds(), maxCancelled, minPlaced, took.Seconds())
	if lowerErr != nil {
		detail = fmt.Sprintf("lowering max.message.bytes to %d failed (%v); the default confirmed in %.1fs", limit, lowerErr, took.Seconds())
	}
	return detail, err
}

// restoreLimit deletes the orders topic's max.message.bytes override and
// returns once the broker describes the topic on its default again,
// retrying for up to limitRestoreFor; it says how long that took.
func (n *nemesisRun) restoreLimit(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(limitRestoreFor)
	for try := 1; ; try++ {
		err := n.alterMaxMessageBytes(ctx, kafka.ConfigOperationDelete, "")
		if err == nil {
			var overridden bool
			if overridden, err = n.maxMessageBytesOverridden(ctx); err == nil && !overridden {
				n.limited.Store(false)
				return time.Since(start), nil
			}
			if err == nil {
				err = errors.New("the topic still has its own max.message.bytes")
			}
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("restoring the orders topic's max.message.bytes: %d tries in %s: %w", try, limitRestoreFor, err)
		}
		hold(ctx, time.Second)
	}
}

// alterMaxMessageBytes sets (op Set) or deletes (op Delete) the orders
// topic's max.message.bytes, and nothing else of its configuration.
func (n *nemesisRun) alterMaxMessageBytes(ctx context.Context, op kafka.ConfigOperation, value string) error {
	client := &kafka.Client{Addr: kafka.TCP(n.h.stack.Brokers()...), Timeout: 10 * time.Second}
	resp, err := client.IncrementalAlterConfigs(ctx, &kafka.IncrementalAlterConfigsRequest{
		Resources: []kafka.IncrementalAlterConfigsRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: n.p.OrdersTopic,
			Configs: []kafka.IncrementalAlterConfigsRequestConfig{{Name: "max.message.bytes", Value: value, ConfigOperation: op}},
		}},
	})
	if err != nil {
		return err
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			return r.Error
		}
	}
	return nil
}

// maxMessageBytesOverridden reports whether the orders topic has a
// max.message.bytes of its own (a dynamic topic config).
func (n *nemesisRun) maxMessageBytesOverridden(ctx context.Context) (bool, error) {
	client := &kafka.Client{Addr: kafka.TCP(n.h.stack.Brokers()...), Timeout: 10 * time.Second}
	resp, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: n.p.OrdersTopic, ConfigNames: []string{"max.message.bytes"}}}})
	if err != nil {
		return false, err
	}
	const dynamicTopicConfig = 1 // DescribeConfigs' config source
	for _, r := range resp.Resources {
		if r.Error != nil {
			return false, r.Error
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == "max.message.bytes" && e.ConfigSource == dynamicTopicConfig {
				return true, nil
			}
		}
	}
	return false, nil
}

// recordBatchSize is the size of a v2 record batch holding m alone, as the
// broker compares it with max.message.bytes: the 61-byte batch header and
// the record, whose lengths are zigzag varints.
func recordBatchSize(m kafka.Message) int {
	vlen := func(n int) int {
		u := uint64((int64(n) << 1) ^ (int64(n) >> 63))
		l := 1
		for u >= 0x80 {
			u >>= 7
			l++
		}
		return l
	}
	body := 1 + vlen(0) + vlen(0) // attributes, timestamp delta, offset delta
	body += vlen(len(m.Key)) + len(m.Key) + vlen(len(m.Value)) + len(m.Value) + vlen(len(m.Headers))
	for _, h := range m.Headers {
		body += vlen(len(h.Key)) + len(h.Key) + vlen(len(h.Value)) + len(h.Value)
	}
	return 61 + vlen(body) + body
}
