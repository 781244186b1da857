package kafkasafe

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// WriteMessages writes msgs and returns once Kafka acknowledged them, as
// kafka.Writer.WriteMessages does, with the same errors: nil, a
// kafka.WriteErrors holding one error per message, a
// kafka.MessageTooLargeError, or the error that stopped the whole write.
//
// A write the relays make at a steady rate holds a few messages, and
// kafka-go's writer spends far more on its machinery per call than on the
// messages: a timer and a goroutine per partition batch, room for BatchSize
// messages allocated per partition, and four goroutine hand-offs before the
// request leaves (about 250 µs of CPU and 1 ms of latency per call on the
// dev stack, against 100 µs and 0.3 ms for the same produce request sent
// directly). So a write whose every partition's messages fit one record
// batch goes as one produce request per partition, straight through the
// writer's transport, with the writer's acks, compression and write
// timeout; a partition whose request fails is written again through
// kafka-go's writer, whose retries and errors the caller then gets. Any
// other write (a message near BatchBytes, more messages for one partition
// than BatchSize, a topic the transport does not know yet, a writer
// configured in a way this path does not reproduce) goes through kafka-go's
// writer as it is. An aggregate's messages share a partition, so they share
// one request and its fate, in order, either way.
func (w *Writer) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if w.closed.Load() {
		return io.ErrClosedPipe
	}
	parts := w.direct(ctx, msgs)
	if parts == nil {
		return w.Writer.WriteMessages(ctx, msgs...)
	}
	if len(parts) == 1 { // a lone partition: no goroutine to wait for
		for p, idx := range parts {
			return w.retry(ctx, msgs, idx, w.produce(ctx, msgs, p, idx))
		}
	}
	errs := make(kafka.WriteErrors, len(msgs))
	failed := false
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for p, idx := range parts {
		wg.Go(func() {
			err := w.retry(ctx, msgs, idx, w.produce(ctx, msgs, p, idx))
			if err == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			failed = true
			spread(errs, idx, err)
		})
	}
	wg.Wait()
	if !failed {
		return nil
	}
	return errs
}

// direct returns msgs' indexes per partition when the write can go as one
// produce request per partition, nil when it must go through kafka-go's
// writer.
func (w *Writer) direct(ctx context.Context, msgs []kafka.Message) map[int][]int {
	kw := w.Writer
	if len(msgs) == 0 || kw.Async || kw.Completion != nil || kw.Topic != "" || kw.Balancer == nil ||
		kw.Logger != nil || kw.ErrorLogger != nil {
		return nil
	}
	topic := msgs[0].Topic
	limit := kw.BatchBytes
	if limit <= 0 {
		limit = 1 << 20 // kafka-go's default
	}
	for i := range msgs {
		// One topic per write (the relays write each topic on its own), and
		// never a message kafka-go might refuse as too large: its writer
		// says so with the error the relays expect.
		if msgs[i].Topic != topic || topic == "" || size(msgs[i]) > limit {
			return nil
		}
	}
	n, ok := w.partitionCount(ctx, topic)
	if !ok {
		return nil
	}
	partitions := make([]int, n)
	for i := range partitions {
		partitions[i] = i
	}
	parts := make(map[int][]int, min(len(msgs), n))
	bytes := make(map[int]int64, min(len(msgs), n))
	for i := range msgs {
		p := kw.Balancer.Balance(msgs[i], partitions...)
		parts[p] = append(parts[p], i)
		bytes[p] += size(msgs[i])
		// Where kafka-go would cut a partition's messages into several
		// record batches, it goes: one request must be one record batch.
		if len(parts[p]) > max(kw.BatchSize, 1) || bytes[p] > limit {
			return nil
		}
	}
	return parts
}

// partitionCount is topic's partition count from the transport's metadata
// (cached: no request while it is fresh); false when the transport does not
// know the topic, for kafka-go's writer to report.
func (w *Writer) partitionCount(ctx context.Context, topic string) (int, bool) {
	md, err := w.client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, false
	}
	for _, t := range md.Topics {
		if t.Name == topic && t.Error == nil && len(t.Partitions) > 0 {
			return len(t.Partitions), true
		}
	}
	return 0, false
}

// produce sends msgs[idx] to partition p as one record batch and waits for
// the acknowledgement.
func (w *Writer) produce(ctx context.Context, msgs []kafka.Message, p int, idx []int) error {
	kw := w.Writer
	records := make([]kafka.Record, len(idx))
	for j, i := range idx {
		m := &msgs[i]
		records[j] = kafka.Record{Time: m.Time, Headers: m.Headers}
		if m.Key != nil {
			records[j].Key = kafka.NewBytes(m.Key)
		}
		if m.Value != nil {
			records[j].Value = kafka.NewBytes(m.Value)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, w.writeTimeout())
	defer cancel()
	res, err := w.client().Produce(ctx, &kafka.ProduceRequest{
		Topic: msgs[idx[0]].Topic, Partition: p, RequiredAcks: kw.RequiredAcks, Compression: kw.Compression,
		Records: kafka.NewRecordReader(records...),
	})
	if err != nil {
		return err
	}
	if res != nil && res.Error != nil {
		return res.Error
	}
	return nil
}

// retry writes msgs[idx] again through kafka-go's writer when the direct
// produce failed (err), so that the caller gets that writer's retries and
// errors; it returns the outcome.
func (w *Writer) retry(ctx context.Context, msgs []kafka.Message, idx []int, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	again := make([]kafka.Message, len(idx))
	for j, i := range idx {
		again[j] = msgs[i]
	}
	return w.Writer.WriteMessages(ctx, again...)
}

// spread records err, the outcome of writing msgs[idx] (a kafka.WriteErrors
// of len(idx), or one error for them all), in errs.
func spread(errs kafka.WriteErrors, idx []int, err error) {
	if we, ok := err.(kafka.WriteErrors); ok && len(we) == len(idx) {
		for j, i := range idx {
			errs[i] = we[j]
		}
		return
	}
	for _, i := range idx {
		errs[i] = err
	}
}

func (w *Writer) client() *kafka.Client {
	return &kafka.Client{Addr: w.Addr, Transport: w.Transport, Timeout: w.writeTimeout()}
}

// writeTimeout is kafka-go's writer's WriteTimeout, with its default.
func (w *Writer) writeTimeout() time.Duration {
	if w.WriteTimeout > 0 {
		return w.WriteTimeout
	}
	return 10 * time.Second
}

// size is at least what kafka-go counts for m against BatchBytes (its
// Message.totalSize: the lengths plus fixed fields and varints, which 64
// bytes and 20 per header more than cover).
func size(m kafka.Message) int64 {
	n := int64(64 + len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(20 + len(h.Key) + len(h.Value))
	}
	return n
}
