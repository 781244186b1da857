package inboxadmin_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// exampleSetup gives an example a database with the inbox schema and a
// topic with its dead-letter topic beside it, as a service has them.
func exampleSetup(ctx context.Context) (*pgxpool.Pool, []string, string, func()) {
	return testenv.ForExample(ctx, `CREATE TABLE charges (order_id text PRIMARY KEY)`,
		[]testenv.Migration{{FS: inbox.Migrations, Table: inbox.MigrationsTable}}, ".dlt")
}

// Once the cause is fixed, an operator sends a consumer's dead letters back
// to their original topic; the inbox rows that recorded them are marked
// requeued, so the redelivery is handled, not skipped as a duplicate.
func ExampleRequeueDeadLetters() {
	ctx := context.Background()
	pool, brokers, topic, cleanup := exampleSetup(ctx)
	defer cleanup()
	w := testenv.NewWriter(brokers, 10)
	defer w.Close()
	refuse := func(context.Context, pgx.Tx, event.Envelope) error {
		return inbox.Permanent(errors.New("unknown customer"))
	}
	src := inbox.GroupConfig{Brokers: brokers, Topic: topic, Group: topic + "-group"}
	c, err := inbox.NewConsumer(pool, src, w, refuse, inbox.Config{Name: "billing"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Handle(ctx, event.ToKafka(topic, event.Envelope{
		EventID: uuid.New(), EventType: "PaymentCaptured", EventVersion: 1, AggregateType: "payment",
		AggregateID: "order-1", AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`),
	})); err != nil {
		fmt.Println(err)
		return
	}
	res, err := inboxadmin.RequeueDeadLetters(ctx, pool, w, brokers, topic+".dlt", inboxadmin.RequeueFilter{Consumer: "billing"})
	fmt.Println("requeued:", res.Requeued, err)
	// Output: requeued: 1 <nil>
}

// An operator's check (tools/reconcile does this) asks for leases whose
// worker died mid-effect, for uncertain effects and for dead letters nobody
// requeued within a day; it reads only, so a read-only role can run it.
func ExampleBacklog() {
	ctx := context.Background()
	pool, _, _, cleanup := exampleSetup(ctx)
	defer cleanup()

	rep, err := inboxadmin.Backlog(ctx, pool, inboxadmin.BacklogConfig{
		LeaseExpiredFor:       time.Minute,
		DeadLetteredOlderThan: 24 * time.Hour,
		Samples:               5,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("expired leases:", rep.LeaseExpired.Count)
	fmt.Println("uncertain:", rep.Uncertain.Count)
	fmt.Println("dead letters over a day old:", rep.DeadLettered.Count)
	// Output:
	// expired leases: 0
	// uncertain: 0
	// dead letters over a day old: 0
}

// Handled events' rows are what make a redelivery a no-op, so they are kept
// for a retention window longer than any redelivery, then pruned. A service
// runs this in the background with inbox.NewPruner(pool, cfg).Run(ctx).
func ExamplePrune() {
	ctx := context.Background()
	pool, brokers, topic, cleanup := exampleSetup(ctx)
	defer cleanup()
	w := testenv.NewWriter(brokers, 10)
	defer w.Close()
	nothing := func(context.Context, pgx.Tx, event.Envelope) error { return nil }
	src := inbox.GroupConfig{Brokers: brokers, Topic: topic, Group: topic + "-group"}
	c, err := inbox.NewConsumer(pool, src, w, nothing, inbox.Config{Name: "billing"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Handle(ctx, event.ToKafka(topic, paymentCaptured("order-1")), event.ToKafka(topic, paymentCaptured("order-2"))); err != nil {
		fmt.Println(err)
		return
	}
	// Stand in for time: one of them was handled 31 days ago.
	if _, err := pool.Exec(ctx, `UPDATE inbox_messages SET processed_at = now() - interval '31 days' WHERE aggregate_id = 'order-1'`); err != nil {
		fmt.Println(err)
		return
	}
	n, err := inboxadmin.Prune(ctx, pool, inbox.PruneConfig{Retention: 30 * 24 * time.Hour})
	fmt.Println("pruned:", n, err)
	// Output: pruned: 1 <nil>
}

func paymentCaptured(orderID string) event.Envelope {
	return event.Envelope{
		EventID: uuid.New(), EventType: "PaymentCaptured", EventVersion: 1, AggregateType: "payment",
		AggregateID: orderID, AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`),
	}
}
