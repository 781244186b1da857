package kafkautil_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// javaPartition is one row of testdata/java-partitions.tsv: the partition
// Kafka's Java producer (kafka-clients 3.9.1, BuiltInPartitioner) picks for
// key among partitions. testdata/PartitionReference.java generated the file;
// its header comment says how to regenerate it.
type javaPartition struct {
	key        []byte
	partitions int
	partition  int
}

func readJavaPartitions(t *testing.T) []javaPartition {
	t.Helper()
	f, err := os.Open("testdata/java-partitions.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []javaPartition
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			t.Fatalf("java-partitions.tsv: malformed line %q", line)
		}
		// "-" is the empty key: non-nil, so it hashes like any other key.
		key := []byte{}
		if f[0] != "-" {
			if key, err = hex.DecodeString(f[0]); err != nil {
				t.Fatalf("java-partitions.tsv: key %q: %v", f[0], err)
			}
		}
		n, err1 := strconv.Atoi(f[1])
		p, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			t.Fatalf("java-partitions.tsv: malformed line %q", line)
		}
		rows = append(rows, javaPartition{key: key, partitions: n, partition: p})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 1000 {
		t.Fatalf("java-partitions.tsv holds %d rows, want the whole table", len(rows))
	}
	return rows
}

// TestWriterPartitionsLikeJava: the same key lands on the same partition
// whoever publishes it (DESIGN.md invariant 10). Debezium, Kafka Connect,
// Kafka Streams and every Java producer pick murmur2; a writer that hashed
// differently would split an aggregate's events over two partitions the day
// a team switches relays or adds a Java producer, and per-aggregate order
// would be lost across the switch.
func TestWriterPartitionsLikeJava(t *testing.T) {
	t.Parallel()
	rows := readJavaPartitions(t)
	w := kafkautil.NewWriter([]string{"127.0.0.1:1"}, 10)
	defer w.Close()

	wrong := 0
	for _, r := range rows {
		parts := make([]int, r.partitions)
		for i := range parts {
			parts[i] = i
		}
		if got := w.Balancer.Balance(kafka.Message{Key: r.key}, parts...); got != r.partition {
			if wrong++; wrong <= 10 {
				t.Errorf("key %q among %d partitions: writer picks %d, Kafka's Java producer %d",
					r.key, r.partitions, got, r.partition)
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d keys land on another partition than Kafka's Java producer picks", wrong, len(rows))
	}
}

// TestWriterPartitionsLikeJavaOnTheBroker writes the reference keys through
// a real broker: the partition a record is stored in is what consumers see,
// whatever the balancer was asked (kafka-go passes the partitions it knows
// from metadata, which must be all of them, in order, for murmur2's modulo to
// match Java's).
func TestWriterPartitionsLikeJavaOnTheBroker(t *testing.T) {
	t.Parallel()
	const partitions = 6
	brokers := testinfra.KafkaBrokers(t)
	topic := testinfra.NewTopic(t, brokers, partitions)

	want := map[string]int{} // key -> partition
	var msgs []kafka.Message
	for _, r := range readJavaPartitions(t) {
		if r.partitions != partitions || len(r.key) == 0 {
			continue
		}
		want[string(r.key)] = r.partition
		msgs = append(msgs, kafka.Message{Topic: topic, Key: r.key, Value: []byte("v")})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A new topic's partitions take a moment to get their leaders, and the
	// writer does not retry (the relays do): wait for them first, as the
	// harness does (make test failed once with Not Leader For Partition).
	if err := kafkautil.WaitTopicsReady(ctx, brokers, topic); err != nil {
		t.Fatalf("waiting for %s: %v", topic, err)
	}
	w := kafkautil.NewWriter(brokers, len(msgs))
	defer w.Close()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("writing: %v", err)
	}

	seen, wrong := 0, 0
	for p := 0; p < partitions; p++ {
		conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, p)
		if err != nil {
			t.Fatalf("dialing partition %d: %v", p, err)
		}
		last, err := conn.ReadLastOffset()
		if err != nil {
			conn.Close()
			t.Fatalf("partition %d: %v", p, err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		for off := int64(0); off < last; off++ {
			m, err := conn.ReadMessage(1 << 20)
			if err != nil {
				conn.Close()
				t.Fatalf("reading partition %d at %d of %d: %v", p, off, last, err)
			}
			seen++
			if want[string(m.Key)] != p {
				if wrong++; wrong > 10 {
					continue
				}
				t.Errorf("key %q stored in partition %d, Kafka's Java producer picks %d", m.Key, p, want[string(m.Key)])
			}
		}
		conn.Close()
	}
	if wrong > 0 {
		t.Errorf("%d of %d records stored in another partition than Kafka's Java producer picks", wrong, seen)
	}
	if seen != len(msgs) {
		t.Errorf("read %d records back, wrote %d", seen, len(msgs))
	}
}
