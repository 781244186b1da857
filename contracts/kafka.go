package contracts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// Target is a topic and the channel of the document its records must be.
type Target struct{ Topic, Channel string }

// Targets are the document's channels on the topics of their addresses.
func (a *AsyncAPI) Targets() []Target {
	var out []Target
	for id, ch := range a.Channels {
		out = append(out, Target{ch.Address, id})
	}
	slices.SortFunc(out, func(x, y Target) int { return strings.Compare(x.Topic, y.Topic) })
	return out
}

// Tally is what CheckTopics found: records by message id per topic, the
// records off the contract, and the events (records of the channels that
// are not dead-letter channels) that were valid.
type Tally struct {
	ByTopic map[string]map[string]int
	Invalid int
	Events  int
}

// CheckTopics reads every record of each target's topic, first offset to
// last as of now, and checks it against the target's channel (Channel.Check,
// with the topic's partition count), writing one line per topic and the
// first show errors of each to out. A topic that does not exist is
// reported and skipped. Only an error reaching or reading Kafka is
// returned: records off the contract are counted in the Tally.
func (a *AsyncAPI) CheckTopics(ctx context.Context, broker string, targets []Target, show int, out io.Writer) (Tally, error) {
	tally := Tally{ByTopic: map[string]map[string]int{}}
	for _, tg := range targets {
		ch := a.Channels[tg.Channel]
		if ch == nil {
			return tally, fmt.Errorf("the document has no channel %s", tg.Channel)
		}
		parts, err := partitions(ctx, broker, tg.Topic)
		if err != nil {
			return tally, err
		}
		if len(parts) == 0 {
			fmt.Fprintf(out, "%-24s no such topic: skipped\n", tg.Topic)
			continue
		}
		counts := map[string]int{}
		var shown int
		for _, p := range parts {
			err := readPartition(ctx, broker, tg.Topic, p, func(m kafka.Message) {
				id, err := ch.Check(m, len(parts))
				if err != nil {
					tally.Invalid++
					counts["INVALID"]++
					if shown < show {
						shown++
						fmt.Fprintf(out, "  %v\n", err)
					}
					return
				}
				counts[id]++
				if !strings.HasSuffix(tg.Channel, "DeadLetters") {
					tally.Events++
				}
			})
			if err != nil {
				return tally, err
			}
		}
		tally.ByTopic[tg.Topic] = counts
		fmt.Fprintf(out, "%-24s %-26s %v\n", tg.Topic, "("+tg.Channel+")", counts)
	}
	return tally, nil
}

// partitions returns topic's partition ids, none when it does not exist.
func partitions(ctx context.Context, broker, topic string) ([]int, error) {
	conn, err := kafka.DialContext(ctx, "tcp", broker)
	if err != nil {
		return nil, fmt.Errorf("reaching Kafka at %s (make up): %w", broker, err)
	}
	defer conn.Close()
	ps, err := conn.ReadPartitions(topic)
	if errors.Is(err, kafka.UnknownTopicOrPartition) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the partitions of %s: %w", topic, err)
	}
	var out []int
	for _, p := range ps {
		if p.Topic == topic {
			out = append(out, p.ID)
		}
	}
	slices.Sort(out)
	return out, nil
}

// readPartition hands each record of the partition, first to last as of
// now, to f.
func readPartition(ctx context.Context, broker, topic string, partition int, f func(kafka.Message)) error {
	conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, partition)
	if err != nil {
		return fmt.Errorf("reaching the leader of %s/%d: %w", topic, partition, err)
	}
	first, last, err := conn.ReadOffsets()
	conn.Close()
	if err != nil {
		return fmt.Errorf("reading the offsets of %s/%d: %w", topic, partition, err)
	}
	if first >= last {
		return nil
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, Partition: partition,
		MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(first); err != nil {
		return err
	}
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			return fmt.Errorf("reading %s/%d at %d of %d: %w", topic, partition, m.Offset, last, err)
		}
		f(m)
		if m.Offset >= last-1 {
			return nil
		}
	}
}
