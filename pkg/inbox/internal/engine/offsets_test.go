package engine

import (
	"maps"
	"testing"

	"github.com/segmentio/kafka-go"
)

func msgAt(partition int, offset int64) kafka.Message {
	return kafka.Message{Topic: "t", Partition: partition, Offset: offset}
}

// handle begins and finishes m under g, as a worker does.
func handle(t *testing.T, g *generation, m kafka.Message) {
	t.Helper()
	if !g.begin() {
		t.Fatalf("generation %d refused to begin offset %d", g.id, m.Offset)
	}
	g.Finish(m, true)
}

func wantPending(t *testing.T, g *generation, want map[int]int64) {
	t.Helper()
	got := g.pending()["t"]
	if !maps.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		t.Fatalf("generation %d would commit %v, want %v", g.id, got, want)
	}
	g.committed(map[string]map[int]int64{"t": got})
}

func TestOffsetsNeverPassAMessageInFlight(t *testing.T) {
	t.Parallel()
	g := newGeneration(1, map[partitionKey]int64{{"t", 0}: 1, {"t", 1}: -2})
	for off := int64(1); off <= 3; off++ {
		if !g.add(msgAt(0, off)) {
			t.Fatalf("add(%d) refused", off)
		}
	}
	if g.add(msgAt(0, 2)) {
		t.Fatalf("an offset fetched twice within one generation was tracked twice")
	}
	if g.add(msgAt(2, 0)) {
		t.Fatalf("a message of a partition not assigned in the generation was tracked")
	}
	handle(t, g, msgAt(0, 2))
	handle(t, g, msgAt(0, 3))
	wantPending(t, g, nil) // offset 1 is still in flight
	handle(t, g, msgAt(0, 1))
	wantPending(t, g, map[int]int64{0: 4})
	wantPending(t, g, nil) // committed already

	// A partition with no committed offset yet (FirstOffset) starts wherever it is fetched from.
	g.add(msgAt(1, 7))
	handle(t, g, msgAt(1, 7))
	wantPending(t, g, map[int]int64{1: 8})
}

// The bug of the Reader-based tracker: after a rebalance kafka-go fetched
// again from the committed offset, the re-fetched in-flight message replaced
// its index entry, the old entry stayed at the head of the queue unfinished,
// and the partition's commits stopped until the process restarted.
func TestOffsetsAReFetchAfterARebalanceDoesNotStallCommits(t *testing.T) {
	t.Parallel()
	assigned := map[partitionKey]int64{{"t", 0}: 5}
	g1 := newGeneration(1, assigned)
	g1.add(msgAt(0, 5))
	g1.add(msgAt(0, 6))
	if !g1.begin() { // offset 5 in a worker's hands when the rebalance comes
		t.Fatal("begin refused")
	}
	g1.end()
	if g1.begin() {
		t.Fatal("an ended generation let new work begin")
	}

	// The same member gets the partition back and fetches 5 again.
	g2 := newGeneration(2, assigned)
	for off := int64(5); off <= 7; off++ {
		if !g2.add(msgAt(0, off)) {
			t.Fatalf("generation 2 refused offset %d", off)
		}
	}
	handle(t, g2, msgAt(0, 5))
	handle(t, g2, msgAt(0, 6))
	handle(t, g2, msgAt(0, 7))
	wantPending(t, g2, map[int]int64{0: 8})

	// The old generation's work finishing late commits nothing, and changes nothing in the new one.
	g1.drop()
	g1.Finish(msgAt(0, 5), true)
	wantPending(t, g1, nil)
	g2.add(msgAt(0, 8))
	handle(t, g2, msgAt(0, 8))
	wantPending(t, g2, map[int]int64{0: 9})
}
