package inbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/kafkasafe"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A consumer handed kafka-go's zero writer for its dead letters refuses to
// start: with acks=0 a dead letter the broker never kept would be counted
// as written and its message's offset committed, and the message would be
// gone (issue 31). The key hash is not asked of a dead-letter writer.
func TestConsumerRefusesAnUnsafeDeadLetterWriter(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	src := inbox.GroupConfig{Brokers: brokers, Topic: "t", Group: "g"}
	h := func(context.Context, pgx.Tx, event.Envelope) error { return nil }
	eff := lease.Effect{Check: func(context.Context, string) (bool, error) { return false, nil },
		Call: func(context.Context, event.Envelope, string) error { return nil }}
	bare := &kafka.Writer{Addr: kafka.TCP(brokers...)}
	defer bare.Close()

	_, err := inbox.NewConsumer(testenv.LazyPool(t), src, bare, h, inbox.Config{Name: "c"})
	testenv.CheckErr(t, err, "dead-letter writer")
	testenv.CheckErr(t, err, "RequiredAcks is 0")
	testenv.CheckErr(t, err, "BatchTimeout is 0")
	if strings.Contains(err.Error(), "Balancer") {
		t.Errorf("the dead-letter writer was asked for a key hash: %v", err)
	}
	_, err = lease.NewConsumer(testenv.LazyPool(t), src, bare, eff, lease.Config{Config: inbox.Config{Name: "c"}})
	testenv.CheckErr(t, err, "RequiredAcks is 0")

	safe := kafkasafe.NewWriter(brokers, kafkasafe.WriterConfig{})
	defer safe.Close()
	if _, err := inbox.NewConsumer(testenv.LazyPool(t), src, safe, h, inbox.Config{Name: "c"}); err != nil {
		t.Errorf("kafkasafe's writer refused: %v", err)
	}
}
