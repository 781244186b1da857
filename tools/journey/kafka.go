package journey

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// Record is one Kafka record as Scan reads it.
type Record struct {
	Topic     string            `json:"topic"`
	Partition int               `json:"partition"`
	Offset    int64             `json:"offset"`
	Time      time.Time         `json:"time"`
	Key       string            `json:"key"`
	Headers   map[string]string `json:"headers"`
	Value     []byte            `json:"-"`
}

type record = Record

// ScanConfig says which records of a topic Scan reads.
type ScanConfig struct {
	// Since: each partition is read from its first record stamped at or
	// after this time (Kafka's time index); zero reads from the start.
	Since time.Time
	// Key keeps only the records with this key; "" keeps all.
	Key string
	// Last reads only the last this many records of each partition; 0
	// reads from Since (or the start).
	Last int
	// Max bounds the records read (kept or not) over all partitions; 0 is
	// unbounded. Scan reports whether it stopped there.
	Max int
	// Each is called with each kept record, in partition then offset
	// order; nil collects them. An error from it ends the scan.
	Each func(Record) error
}

// Scan reads topic's partitions up to the end each had when Scan began, so
// it ends on a topic that keeps growing. It connects to each partition's
// leader directly: no consumer group, nothing committed, nothing the
// services' consumers can notice. The dev stack's brokers are plaintext.
func Scan(ctx context.Context, brokers []string, topic string, cfg ScanConfig) (kept []Record, cut bool, err error) {
	if len(brokers) == 0 {
		return nil, false, errors.New("no brokers given")
	}
	dialer := &kafka.Dialer{Timeout: 5 * time.Second}
	conn, err := dialer.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return nil, false, fmt.Errorf("dialing %s: %w", brokers[0], err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	parts, err := conn.ReadPartitions(topic)
	if err != nil {
		return nil, false, fmt.Errorf("reading %s's partitions: %w", topic, err)
	}
	each := cfg.Each
	if each == nil {
		each = func(r Record) error { kept = append(kept, r); return nil }
	}
	read := 0
	for _, p := range parts {
		if p.Topic != topic {
			continue
		}
		n, stop, err := scanPartition(ctx, dialer, p, cfg, cfg.Max-read, each)
		read += n
		if err != nil {
			return kept, false, err
		}
		if stop {
			return kept, true, nil
		}
	}
	return kept, false, nil
}

// scanPartition reads one partition; budget <= 0 with cfg.Max set stops.
func scanPartition(ctx context.Context, dialer *kafka.Dialer, p kafka.Partition, cfg ScanConfig, budget int,
	each func(Record) error) (read int, cut bool, err error) {
	leader := net.JoinHostPort(p.Leader.Host, strconv.Itoa(p.Leader.Port))
	lc, err := dialer.DialLeader(ctx, "tcp", leader, p.Topic, p.ID)
	if err != nil {
		return 0, false, fmt.Errorf("dialing %s/%d's leader %s: %w", p.Topic, p.ID, leader, err)
	}
	defer lc.Close()
	deadline := func() { _ = lc.SetDeadline(time.Now().Add(10 * time.Second)) }
	deadline()
	first, last, err := lc.ReadOffsets()
	if err != nil {
		return 0, false, fmt.Errorf("reading %s/%d's offsets: %w", p.Topic, p.ID, err)
	}
	if !cfg.Since.IsZero() {
		at, err := lc.ReadOffset(cfg.Since)
		if err != nil {
			return 0, false, fmt.Errorf("reading %s/%d's offset at %s: %w", p.Topic, p.ID, cfg.Since, err)
		}
		// No record that recent: the broker answers -1 (or the end).
		if at < 0 || at >= last {
			return 0, false, nil
		}
		first = max(first, at)
	}
	if cfg.Last > 0 {
		first = max(first, last-int64(cfg.Last))
	}
	if first >= last {
		return 0, false, nil
	}
	if _, err := lc.Seek(first, kafka.SeekAbsolute); err != nil {
		return 0, false, fmt.Errorf("seeking %s/%d to %d: %w", p.Topic, p.ID, first, err)
	}
	next := first
	for next < last {
		if err := ctx.Err(); err != nil {
			return read, false, err
		}
		deadline()
		batch := lc.ReadBatch(1, 16<<20)
		before := next
		for {
			m, err := batch.ReadMessage()
			if err != nil {
				cerr := batch.Close()
				if !errors.Is(err, io.EOF) {
					return read, false, fmt.Errorf("reading %s/%d at %d: %w", p.Topic, p.ID, next, err)
				}
				if cerr != nil {
					return read, false, fmt.Errorf("reading %s/%d at %d: %w", p.Topic, p.ID, next, cerr)
				}
				break
			}
			if m.Offset < next { // a compressed batch starts before the offset asked for
				continue
			}
			next = m.Offset + 1
			read++
			if cfg.Key == "" || string(m.Key) == cfg.Key {
				h := make(map[string]string, len(m.Headers))
				for _, kv := range m.Headers {
					h[kv.Key] = string(kv.Value)
				}
				if err := each(Record{Topic: p.Topic, Partition: p.ID, Offset: m.Offset, Time: m.Time,
					Key: string(m.Key), Headers: h, Value: m.Value}); err != nil {
					_ = batch.Close()
					return read, false, err
				}
			}
			if (cfg.Max > 0 && read >= budget) || next >= last {
				_ = batch.Close()
				return read, cfg.Max > 0 && read >= budget && next < last, nil
			}
		}
		// Only control records (transaction markers) left: nothing more
		// a client can read below the end.
		if next == before {
			return read, false, nil
		}
	}
	return read, false, nil
}
