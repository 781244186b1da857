package contracts_test

import (
	"github.com/segmentio/kafka-go"
)

// kafkaMessage is a record a test edits.
type kafkaMessage struct{ kafka.Message }

func (m *kafkaMessage) dropHeader(key string) {
	var hs []kafka.Header
	for _, h := range m.Headers {
		if h.Key != key {
			hs = append(hs, h)
		}
	}
	m.Headers = hs
}

func (m *kafkaMessage) setHeader(key, value string) {
	m.dropHeader(key)
	m.Headers = append(m.Headers, kafka.Header{Key: key, Value: []byte(value)})
}

// murmur2Partition is the partition Kafka's Java client picks for key.
func murmur2Partition(key []byte, partitions int) int {
	all := make([]int, partitions)
	for i := range all {
		all[i] = i
	}
	return (&kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: key}, all...)
}
