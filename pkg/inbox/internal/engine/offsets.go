package engine

import (
	"sync"

	"github.com/segmentio/kafka-go"
)

// generation is one consumer-group generation as this member lives it: the
// partitions the group assigned to it and, per partition, the messages
// fetched and not yet committed. Tracking is per generation, so a message
// fetched again after a rebalance (kafka-go restarts from the committed
// offset) is a new entry of a new generation and never collides with the
// old one; and offsets are committed only with the generation's own id, so
// a member that lost a partition cannot move its committed offset back
// after the new owner went further (the coordinator refuses a commit of an
// older generation).
type generation struct {
	id int32
	// parent: a generation for messages released from the parking (see
	// released), dropped when its parent is.
	parent *generation

	mu       sync.Mutex
	ended    bool // no new work starts: the partitions may belong to another member now
	dropped  bool // tracking is gone: work still in hand is abandoned
	inflight int  // messages a worker began and has not finished
	parts    map[partitionKey]*partitionTrack
}

type partitionKey struct {
	topic     string
	partition int
}

// partitionTrack is one assigned partition within one generation.
type partitionTrack struct {
	queue []*tracked // in fetch order, which is offset order
	index map[int64]*tracked
	// fetched is one past the highest offset added: a partition reader never
	// goes back within a generation, and a message seen twice is ignored.
	fetched int64
	// commit is the offset to commit (Kafka's next-offset semantics: one
	// past the last message done with every message before it), -1 until a
	// message is done; committed is the last offset the coordinator took.
	commit, committed int64
}

type tracked struct {
	offset int64
	done   bool
}

// newGeneration tracks the partitions assigned in generation id, each
// starting at its assigned offset (negative: no committed offset yet).
func newGeneration(id int32, assigned map[partitionKey]int64) *generation {
	g := &generation{id: id, parts: make(map[partitionKey]*partitionTrack, len(assigned))}
	for k, off := range assigned {
		p := &partitionTrack{index: map[int64]*tracked{}, fetched: -1, commit: -1, committed: -1}
		if off >= 0 {
			p.fetched, p.commit, p.committed = off, off, off
		}
		g.parts[k] = p
	}
	return g
}

// add tracks m, fetched in this generation. It returns false, and m must not
// be handled under this generation, when the generation has ended, m's
// partition is not assigned in it, or m was fetched already.
func (g *generation) add(m kafka.Message) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.parts[partitionKey{m.Topic, m.Partition}]
	if g.ended || p == nil || m.Offset < p.fetched {
		return false
	}
	t := &tracked{offset: m.Offset}
	p.queue = append(p.queue, t)
	p.index[m.Offset] = t
	p.fetched = m.Offset + 1
	return true
}

// begin is called by a worker before it handles m. False means the
// generation has ended: m is left to whoever owns its partition now, which
// fetches it again from the committed offset.
func (g *generation) begin() bool {
	if g == nil { // handed in through Handle: nothing to track
		return true
	}
	if g.parent != nil && !g.parent.live() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return false
	}
	g.inflight++
	return true
}

// Finish is called once for every begin. ok says m's work committed (or was
// settled without work); only then may the offset pass it. A message
// abandoned (ok false) holds its partition's offset back, and it is fetched
// again in a later generation.
func (g *generation) Finish(m kafka.Message, ok bool) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	if !ok || g.dropped {
		return
	}
	p := g.parts[partitionKey{m.Topic, m.Partition}]
	if p == nil || p.index[m.Offset] == nil {
		return
	}
	p.index[m.Offset].done = true
	for len(p.queue) > 0 && p.queue[0].done {
		p.commit = p.queue[0].offset + 1
		delete(p.index, p.queue[0].offset)
		p.queue = p.queue[1:]
	}
}

// pending returns the offsets to commit: each partition whose commit offset
// moved past the last one committed. Nothing once the generation is dropped.
func (g *generation) pending() map[string]map[int]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dropped {
		return nil
	}
	var out map[string]map[int]int64
	for k, p := range g.parts {
		if p.commit <= p.committed {
			continue
		}
		if out == nil {
			out = map[string]map[int]int64{}
		}
		if out[k.topic] == nil {
			out[k.topic] = map[int]int64{}
		}
		out[k.topic][k.partition] = p.commit
	}
	return out
}

// committed records that the coordinator took offs.
func (g *generation) committed(offs map[string]map[int]int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for topic, parts := range offs {
		for partition, off := range parts {
			if p := g.parts[partitionKey{topic, partition}]; p != nil && off > p.committed {
				p.committed = off
			}
		}
	}
}

// end stops new work from starting under the generation.
func (g *generation) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ended = true
}

// live reports whether work may still start under g.
func (g *generation) live() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.ended
}

// drained reports whether no worker is handling a message of the generation.
func (g *generation) drained() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inflight == 0
}

// drop forgets the generation's tracking: nothing more is committed for it,
// and workers still handling its messages abandon them at their next wait.
func (g *generation) drop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ended, g.dropped = true, true
	g.parts = nil
}

// IsDropped reports whether drop was called (on its parent, for released).
func (g *generation) IsDropped() bool {
	if g.parent != nil {
		return g.parent.IsDropped()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dropped
}

// released is the generation of a message released from the parking
// (park.go), handled under g: abandoned when g is dropped, but tracking no
// offset, since it was not fetched in g (its own offset was committed when
// it was parked).
func (g *generation) released() *generation {
	if g == nil {
		return nil
	}
	return &generation{id: g.id, parent: g}
}
