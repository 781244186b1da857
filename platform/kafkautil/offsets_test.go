package kafkautil_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// EndOffsets says where each partition ends; ReadRange reads a window of
// each, or all of it from the first record.
func TestEndOffsetsAndReadRange(t *testing.T) {
	t.Parallel()
	brokers := testinfra.KafkaBrokers(t)
	topic := testinfra.NewTopic(t, brokers, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := kafkautil.NewWriter(brokers, 10) // a transport of its own: it learns of the new topic
	defer w.Close()
	var msgs []kafka.Message
	for _, v := range []string{"a1", "a2", "a3", "b1"} {
		msgs = append(msgs, kafka.Message{Topic: topic, Key: []byte(v[:1]), Value: []byte(v)})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	// A transport of its own: the default one may hold metadata from before
	// the topic had leaders.
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: &kafka.Transport{}}
	ends, err := kafkautil.EndOffsets(ctx, client, topic, []int{0, 1})
	if err != nil || len(ends) != 2 || ends[0]+ends[1] != 4 {
		t.Fatalf("EndOffsets = %v, %v; want two partitions holding 4 records", ends, err)
	}
	all, err := kafkautil.ReadRange(ctx, brokers, topic, nil, ends, 0, 20*time.Second)
	if err != nil || len(all) != 4 {
		t.Fatalf("ReadRange from the start = %d records, %v; want 4", len(all), err)
	}
	// The last record of each partition that has one, alone.
	from, to := map[int]int64{}, map[int]int64{}
	var want []string
	for _, m := range all {
		if m.Offset == ends[m.Partition]-1 {
			from[m.Partition], to[m.Partition] = m.Offset, ends[m.Partition]
			want = append(want, string(m.Value))
		}
	}
	last, err := kafkautil.ReadRange(ctx, brokers, topic, from, to, 0, 20*time.Second)
	var got []string
	for _, m := range last {
		got = append(got, string(m.Value))
	}
	slices.Sort(got)
	slices.Sort(want)
	if err != nil || len(want) == 0 || !slices.Equal(got, want) {
		t.Fatalf("ReadRange of the last records = %v, %v; want %v", got, err, want)
	}
}
