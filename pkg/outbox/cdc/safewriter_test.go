package cdc_test

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/kafkasafe"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A relay handed kafka-go's zero writer refuses to start, naming each
// setting, instead of marking rows published that no broker acknowledged
// (acks=0), waiting a second per batch and spreading an aggregate's events
// over partitions (issue 31). The writer kafkasafe builds, and a writer
// that sets the three itself, are taken.
func TestRelayRefusesAnUnsafeWriter(t *testing.T) {
	t.Parallel()
	pool := testenv.LazyPool(t)
	brokers := testenv.KafkaBrokers(t)
	bare := &kafka.Writer{Addr: kafka.TCP(brokers...)}
	defer bare.Close()
	for _, c := range []struct {
		name string
		new  func(outbox.Writer) error
	}{
		{"poll", func(w outbox.Writer) error { _, err := outbox.NewRelay(pool, w, outbox.RelayConfig{}); return err }},
		{"cdc", func(w outbox.Writer) error { _, err := cdc.NewRelay(pool, w, cdc.Config{}); return err }},
		{"publisher", func(w outbox.Writer) error {
			_, err := cdc.NewPublisher(pool, w, cdc.PublisherConfig{Mode: outbox.ModeWAL})
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.new(bare)
			for _, want := range []string{"RequiredAcks is 0", "BatchTimeout is 0 (kafka-go's default, 1s)", "Balancer is <nil>", "kafkasafe.NewWriter"} {
				testenv.CheckErr(t, err, want)
			}
			// One setting wrong is named alone.
			slow := &kafka.Writer{Addr: kafka.TCP(brokers...), RequiredAcks: kafka.RequireAll,
				BatchTimeout: time.Second, Balancer: &kafka.Murmur2Balancer{}}
			defer slow.Close()
			testenv.CheckErr(t, c.new(slow), "BatchTimeout is 1s")
			fnv := &kafka.Writer{Addr: kafka.TCP(brokers...), RequiredAcks: kafka.RequireAll,
				BatchTimeout: time.Millisecond, Balancer: &kafka.Hash{}}
			defer fnv.Close()
			testenv.CheckErr(t, c.new(fnv), "Balancer is *kafka.Hash")

			safe := kafkasafe.NewWriter(brokers, kafkasafe.WriterConfig{})
			defer safe.Close()
			if err := c.new(safe); err != nil {
				t.Errorf("kafkasafe's writer refused: %v", err)
			}
			if err := c.new(safe.Writer); err != nil {
				t.Errorf("the *kafka.Writer kafkasafe built, unwrapped, refused: %v", err)
			}
		})
	}
}
