package kafkasafe

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
)

// WriteMessages writes msgs and returns once Kafka acknowledged them, as
// kafka.Writer.WriteMessages does, with the same errors: nil, a
// kafka.WriteErrors holding one error per message, a
// kafka.MessageTooLargeError, or the error that stopped the whole write.
//
// A write the relays make at a steady rate holds a few messages, and
// kafka-go's writer spends far more on its machinery per call than on the
// messages: a timer and a goroutine per partition batch, room for BatchSize
// messages allocated per partition, four goroutine hand-offs before a
// request leaves, and a request per partition (about 250 µs of CPU and
// 1 ms of latency per call of one message on the dev stack, against 100 µs
// and 0.3 ms for the same produce request sent directly). So a write whose
// every partition's messages fit one record batch goes as one produce
// request per leading broker, each partition's messages one record batch,
// straight through the writer's transport, with the writer's acks,
// compression and write timeout. The partitions a broker did not
// acknowledge are written again through kafka-go's writer, whose retries
// and errors the caller then gets (a request that timed out may have been
// appended: the messages are then written twice, in order, as kafka-go's
// own retries would). Any other write (a message near BatchBytes, more
// messages for one partition than BatchSize, a topic the transport does not
// know yet, a writer configured in a way this path does not reproduce) goes
// through kafka-go's writer as it is. An aggregate's messages share a
// partition, so they share one record batch and its fate, in order, either
// way.
func (w *Writer) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if w.closed.Load() {
		return io.ErrClosedPipe
	}
	leaders := w.direct(ctx, msgs)
	if leaders == nil {
		return w.Writer.WriteMessages(ctx, msgs...)
	}
	var failed []bool      // per message: its partition's request failed
	if len(leaders) == 1 { // one broker leads them all: no goroutine to wait for
		for _, parts := range leaders {
			failed = w.produce(ctx, msgs, parts, failed)
		}
	} else {
		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		for _, parts := range leaders {
			wg.Go(func() {
				f := w.produce(ctx, msgs, parts, nil)
				mu.Lock()
				defer mu.Unlock()
				for i, bad := range f {
					if bad {
						if failed == nil {
							failed = make([]bool, len(msgs))
						}
						failed[i] = true
					}
				}
			})
		}
		wg.Wait()
	}
	if failed == nil {
		return nil
	}
	return w.retry(ctx, msgs, failed)
}

// partition is one partition's messages in a write: their indexes, in
// order.
type partition struct {
	id  int
	idx []int
}

// direct returns msgs' partitions per leading broker when the write can go
// as one produce request per broker, each partition's messages one record
// batch; nil when it must go through kafka-go's writer.
func (w *Writer) direct(ctx context.Context, msgs []kafka.Message) map[int][]partition {
	kw := w.Writer
	if len(msgs) == 0 || kw.Async || kw.Completion != nil || kw.Topic != "" || kw.Balancer == nil ||
		kw.Logger != nil || kw.ErrorLogger != nil || kw.RequiredAcks == kafka.RequireNone {
		return nil
	}
	topic := msgs[0].Topic
	limit, count := kw.BatchBytes, kw.BatchSize
	if limit <= 0 {
		limit = 1 << 20 // kafka-go's default
	}
	if count <= 0 {
		count = 100 // kafka-go's default
	}
	for i := range msgs {
		// One topic per write (the relays write each topic on its own), and
		// never a message kafka-go might refuse as too large: its writer
		// says so with the error the relays expect.
		if msgs[i].Topic != topic || topic == "" || size(msgs[i]) > limit {
			return nil
		}
	}
	leaderOf, ok := w.leaders(ctx, topic)
	if !ok {
		return nil
	}
	ids := make([]int, len(leaderOf))
	for i := range ids {
		ids[i] = i
	}
	at := make(map[int]int, min(len(msgs), len(ids))) // partition -> index in its leader's list
	leaders := map[int][]partition{}
	bytes := make(map[int]int64, min(len(msgs), len(ids)))
	for i := range msgs {
		p := kw.Balancer.Balance(msgs[i], ids...)
		if p < 0 || p >= len(ids) {
			return nil
		}
		b := leaderOf[p]
		j, seen := at[p]
		if !seen {
			j = len(leaders[b])
			at[p] = j
			leaders[b] = append(leaders[b], partition{id: p})
		}
		leaders[b][j].idx = append(leaders[b][j].idx, i)
		bytes[p] += size(msgs[i])
		// Where kafka-go would cut a partition's messages into several
		// record batches, it goes: one partition's messages must be one
		// record batch.
		if len(leaders[b][j].idx) > count || bytes[p] > limit {
			return nil
		}
	}
	return leaders
}

// leaders is the leading broker of each of topic's partitions, from the
// transport's metadata (cached: no request while it is fresh); false when
// the transport does not know the topic, for kafka-go's writer to report.
func (w *Writer) leaders(ctx context.Context, topic string) ([]int, bool) {
	md, err := w.client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, false
	}
	for _, t := range md.Topics {
		if t.Name != topic || t.Error != nil || len(t.Partitions) == 0 {
			continue
		}
		leaderOf := make([]int, len(t.Partitions))
		for _, p := range t.Partitions {
			if p.ID < 0 || p.ID >= len(leaderOf) {
				return nil, false
			}
			leaderOf[p.ID] = p.Leader.ID
		}
		return leaderOf, true
	}
	return nil, false
}

// produce sends parts, partitions of one leading broker, in one produce
// request, each partition's messages one record batch, and waits for the
// acknowledgement. It marks in failed (allocated if nil) the messages of
// the partitions that were not acknowledged, and returns it.
func (w *Writer) produce(ctx context.Context, msgs []kafka.Message, parts []partition, failed []bool) []bool {
	kw := w.Writer
	topic := msgs[parts[0].idx[0]].Topic
	req := &produceAPI.Request{Acks: int16(kw.RequiredAcks), Topics: []produceAPI.RequestTopic{{
		Topic: topic, Partitions: make([]produceAPI.RequestPartition, len(parts)),
	}}}
	for k, p := range parts {
		records := make([]kafka.Record, len(p.idx))
		for j, i := range p.idx {
			m := &msgs[i]
			records[j] = kafka.Record{Time: m.Time, Headers: m.Headers}
			if m.Key != nil {
				records[j].Key = kafka.NewBytes(m.Key)
			}
			if m.Value != nil {
				records[j].Value = kafka.NewBytes(m.Value)
			}
		}
		req.Topics[0].Partitions[k] = produceAPI.RequestPartition{Partition: int32(p.id), RecordSet: protocol.RecordSet{
			Attributes: protocol.Attributes(kw.Compression) & 0x7, Records: kafka.NewRecordReader(records...),
		}}
	}
	ctx, cancel := context.WithTimeout(ctx, w.writeTimeout())
	defer cancel()
	// The broker's own wait, half of what is left of ctx as kafka-go's
	// client asks, so that its answer arrives before ctx ends.
	req.Timeout = int32(max(time.Until(deadline(ctx))/2, time.Millisecond) / time.Millisecond)
	res, err := w.roundTripper().RoundTrip(ctx, w.Addr, req)
	acked := map[int32]bool{}
	if r, ok := res.(*produceAPI.Response); err == nil && ok {
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				if t.Topic == topic && p.ErrorCode == 0 {
					acked[p.Partition] = true
				}
			}
		}
	}
	for _, p := range parts {
		if acked[int32(p.id)] {
			continue
		}
		if failed == nil {
			failed = make([]bool, len(msgs))
		}
		for _, i := range p.idx {
			failed[i] = true
		}
	}
	return failed
}

// retry writes the messages whose direct produce failed again through
// kafka-go's writer, so that the caller gets that writer's retries and
// errors, and returns the write's outcome.
func (w *Writer) retry(ctx context.Context, msgs []kafka.Message, failed []bool) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var idx []int
	for i, bad := range failed {
		if bad {
			idx = append(idx, i)
		}
	}
	if len(idx) == len(msgs) {
		return w.Writer.WriteMessages(ctx, msgs...)
	}
	again := make([]kafka.Message, len(idx))
	for j, i := range idx {
		again[j] = msgs[i]
	}
	err := w.Writer.WriteMessages(ctx, again...)
	if err == nil {
		return nil
	}
	errs := make(kafka.WriteErrors, len(msgs))
	spread(errs, idx, err)
	return errs
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

func (w *Writer) roundTripper() kafka.RoundTripper {
	if w.Transport != nil {
		return w.Transport
	}
	return kafka.DefaultTransport
}

// deadline is ctx's deadline; ctx always has one here.
func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
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
