package contracts_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/contracts"
	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// An inbox whose handler is wrapped by Validating dead-letters an event
// off the contract with the schema error as dlt-reason: here an OrderPlaced
// whose currency is "eur", which billing's own decoding accepts (it checks
// only that the code has three letters) and the document refuses; the
// event beside it, on the contract, reaches the handler.
func TestValidatingDeadLettersAnEventOffTheContract(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ch := loadAsyncAPI(t).Channels["ordersEvents"]
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 1)
	testenv.NewTopicNamed(t, brokers, topic+".dlt", 1)
	pool := inboxtest.NewDatabase(t)
	w := testenv.NewWriter(brokers, 10)
	t.Cleanup(func() { w.Close() })

	good, bad := envelopeOf(t, goEvents()[0]), envelopeOf(t, goEvents()[0])
	bad.Payload = []byte(strings.Replace(string(bad.Payload), `"EUR"`, `"eur"`, 1))
	if err := w.WriteMessages(ctx, event.ToKafka(topic, good), event.ToKafka(topic, bad)); err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		if ev.EventID != good.EventID {
			t.Errorf("the handler ran for event %s, off the contract", ev.EventID)
		}
		return nil
	}
	c, err := inbox.NewConsumer(pool, inbox.GroupConfig{Brokers: brokers, Topic: topic, Group: topic + "-g"}, w,
		ch.Validating(handler), inbox.Config{Name: "contracts"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "consumer", c.Run)

	dl := readAll(ctx, t, brokers, topic+".dlt", 1)[0]
	h, _ := contracts.HeaderObject(dl.Headers)
	reason, _ := h[inboxadmin.HeaderDLTReason].(string)
	if !strings.Contains(reason, "off the contract") || !strings.Contains(reason, "/currency") || string(dl.Key) != bad.AggregateID {
		t.Fatalf("dead letter of %q with reason %q; want the eur event's, with the schema error on /currency", dl.Key, reason)
	}
	t.Logf("dlt-reason: %s", reason)
	// Judged by the good event's inbox row, not by counting handler calls:
	// when both arrive in one batch, the bad one's failure rolls the batch
	// back and the good one's handler runs again in a transaction of its
	// own (a call count of 2 failed this test in a loaded make test).
	testenv.WaitFor(t, 30*time.Second, "the good event processed", func() (bool, error) {
		rows, err := inboxadmin.MessagesOf(ctx, pool, good.AggregateID)
		return len(rows) == 1 && rows[0].MessageID == good.EventID && rows[0].Status == "processed", err
	})
}
