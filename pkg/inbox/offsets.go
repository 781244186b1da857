package inbox

import (
	"context"
	"sync"

	"github.com/segmentio/kafka-go"
)

// offsets commits a partition's offset only up to the last message before
// which every message is done: workers finish out of order, but a committed
// offset must never pass a message still in flight.
type offsets struct {
	r     Reader
	mu    sync.Mutex
	parts map[int]*partition
}

type partition struct {
	queue []*tracked // in fetch order, so in offset order
	index map[int64]*tracked
}

type tracked struct {
	m    kafka.Message
	done bool
}

func newOffsets(r Reader) *offsets { return &offsets{r: r, parts: map[int]*partition{}} }

func (o *offsets) add(m kafka.Message) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.parts[m.Partition]
	if p == nil {
		p = &partition{index: map[int64]*tracked{}}
		o.parts[m.Partition] = p
	}
	t := &tracked{m: m}
	p.queue = append(p.queue, t)
	p.index[m.Offset] = t
}

// done marks m finished and commits the partition's offset as far as it can.
func (o *offsets) done(ctx context.Context, m kafka.Message) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.parts[m.Partition]
	if p == nil || p.index[m.Offset] == nil {
		return nil // already past it
	}
	p.index[m.Offset].done = true
	var last *tracked
	for len(p.queue) > 0 && p.queue[0].done {
		last = p.queue[0]
		delete(p.index, last.m.Offset)
		p.queue = p.queue[1:]
	}
	if last == nil {
		return nil
	}
	// Under the lock, so commits of one partition are made in offset order.
	return o.r.CommitMessages(ctx, last.m)
}
