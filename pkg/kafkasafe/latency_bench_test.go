package kafkasafe_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/kafkasafe"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// BenchmarkWriteLatency is what one synchronous write of a few messages
// waits for, the relay's case (it writes a claimed batch and waits for the
// acks): through kafka-go's writer by BatchTimeout (it holds every partial
// batch that long before it sends it, even when the caller has nothing more
// to add), and through Writer.WriteMessages's own produce requests.
func BenchmarkWriteLatency(b *testing.B) {
	brokers := testenv.KafkaBrokers(b)
	topic := testenv.NewTopic(b, brokers, 6)
	for _, msgs := range []int{1, 10} {
		for _, path := range []struct {
			name    string
			timeout time.Duration
			direct  bool
		}{{"kafka-go/timeout=200µs", 200 * time.Microsecond, false}, {"kafka-go/timeout=1µs", time.Microsecond, false}, {"direct", 0, true}} {
			b.Run(fmt.Sprintf("msgs=%d/%s", msgs, path.name), func(b *testing.B) {
				w := kafkasafe.NewWriter(brokers, kafkasafe.WriterConfig{BatchTimeout: path.timeout})
				defer w.Close()
				write := w.Writer.WriteMessages // kafka-go's writer
				if path.direct {
					write = w.WriteMessages
				}
				batch := make([]kafka.Message, msgs)
				for i := range batch {
					batch[i] = kafka.Message{Topic: topic, Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")}
				}
				ctx := context.Background()
				testenv.WaitFor(b, 20*time.Second, "the topic to take writes", func() (bool, error) {
					return write(ctx, batch...) == nil, nil
				})
				const writes = 400
				lat := make([]time.Duration, 0, writes)
				b.ResetTimer()
				for range b.N {
					lat = lat[:0]
					for range writes {
						t0 := time.Now()
						if err := write(ctx, batch...); err != nil {
							b.Fatal(err)
						}
						lat = append(lat, time.Since(t0))
					}
				}
				sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}
