package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// tail shows a topic's last records with their headers, across partitions,
// oldest first, and -key keeps one aggregate's.
func TestTailShowsTheLastRecordsWithTheirHeaders(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	brokers := testinfra.KafkaBrokers(t)
	topic := testinfra.NewTopic(t, brokers, 3)
	if err := kafkautil.WaitTopicsReady(ctx, brokers, topic); err != nil {
		t.Fatal(err)
	}
	w := kafkautil.NewWriter(brokers, 10)
	defer w.Close()
	// Each record its own millisecond: tail orders by record time, and four
	// writes can all land within one millisecond (its order within one is
	// the partitions').
	t0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	for i, key := range []string{"a", "b", "c", "a"} {
		if err := w.WriteMessages(ctx, kafka.Message{Topic: topic, Time: t0.Add(time.Duration(i) * time.Millisecond), Key: []byte(key), Value: []byte(`{"n":` + string(rune('0'+i)) + `}`),
			Headers: []kafka.Header{{Key: "event-type", Value: []byte("Thing")}, {Key: "seq", Value: []byte{byte('0' + i)}}}}); err != nil {
			t.Fatal(err)
		}
	}
	tailOf := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(ctx, append([]string{"kafkactl", "tail", "-brokers", strings.Join(brokers, ",")}, append(args, topic)...), nil, &out); err != nil {
			t.Fatalf("tail %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	out := tailOf("-n", "2")
	if strings.Count(out, "partition ") != 2 || !strings.Contains(out, "seq: 2") || !strings.Contains(out, "seq: 3") ||
		strings.Index(out, "seq: 2") > strings.Index(out, "seq: 3") || !strings.Contains(out, `value: {"n":3}`) ||
		!strings.Contains(out, "event-type: Thing") {
		t.Fatalf("tail -n 2 = \n%s\nwant the last two records, oldest first, with headers and values", out)
	}
	out = tailOf("-key", "a")
	if strings.Count(out, "key a") != 2 || strings.Contains(out, "key b") {
		t.Fatalf("tail -key a = \n%s", out)
	}
	if out := tailOf("-o", "json", "-n", "1"); !strings.Contains(out, `"headers":{`) || strings.Count(out, "\n") != 1 {
		t.Fatalf("tail -o json -n 1 = %s", out)
	}
}
