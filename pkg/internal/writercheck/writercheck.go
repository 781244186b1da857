// Package writercheck refuses a kafka-go writer whose settings break what
// the libraries promise, when a relay or a consumer is built, with a message
// that names the setting to change (STYLE.md rule 28). kafka-go's zero
// values are the trap: a Writer{} literal acks nothing (RequiredAcks 0: a
// row is marked published with no broker holding it), waits a second before
// sending a batch (BatchTimeout 0 means 1 s: the relay writes whole batches
// and waits for each), and spreads keys round-robin (Balancer nil: one
// aggregate's events on several partitions, out of order).
package writercheck

import (
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// MaxBatchTimeout is the longest BatchTimeout a writer may have. The relay
// and the dead-letter path write whole batches and wait for each, so the
// timeout is added to every write's latency; kafka-go's default, a second,
// made 6 events take 2 s (issue 31). A few milliseconds is what is meant.
const MaxBatchTimeout = 100 * time.Millisecond

// Unwrap returns the *kafka.Writer w is or wraps (a wrapper that owns more,
// such as its transport, hands it over with KafkaWriter), or nil for
// another implementation, which is the caller's to configure.
func Unwrap(w any) *kafka.Writer {
	switch w := w.(type) {
	case *kafka.Writer:
		return w
	case interface{ KafkaWriter() *kafka.Writer }:
		return w.KafkaWriter()
	}
	return nil
}

// Check reports each unsafe setting of w, if it is or wraps a *kafka.Writer.
// keyed asks for a key hash that agrees with Kafka's Java producer
// (murmur2), for writers whose keys decide partitions that other producers
// also write (the relay: DESIGN.md invariants 4 and 10). who names the
// writer's user in the message ("outbox relay", "inbox dead-letter writer").
func Check(w any, keyed bool, who string) error {
	kw := Unwrap(w)
	if kw == nil {
		return nil
	}
	var errs []error
	if kw.RequiredAcks != kafka.RequireAll {
		errs = append(errs, fmt.Errorf("RequiredAcks is %d, want kafka.RequireAll (-1): with fewer acks a write the broker loses is taken as published", int(kw.RequiredAcks)))
	}
	if bt := kw.BatchTimeout; bt == 0 || bt >= MaxBatchTimeout {
		shown := bt.String()
		if bt == 0 {
			shown = "0 (kafka-go's default, 1s)"
		}
		errs = append(errs, fmt.Errorf("BatchTimeout is %s, want less than %s (a few ms): every write waits for it", shown, MaxBatchTimeout))
	}
	if keyed && !murmur2(kw.Balancer) {
		errs = append(errs, fmt.Errorf("Balancer is %T, want &kafka.Murmur2Balancer{}: keys must land on the partitions Kafka's Java producer picks", kw.Balancer))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%s: unsafe *kafka.Writer (build it with kafkasafe.NewWriter): %w", who, errors.Join(errs...))
}

func murmur2(b kafka.Balancer) bool {
	switch b.(type) {
	case kafka.Murmur2Balancer, *kafka.Murmur2Balancer:
		return true
	}
	return false
}
