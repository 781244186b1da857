package inboxtest_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A handler's test runs it through the consumer's real transaction path,
// without Kafka, and asserts what the inbox recorded: here that a
// redelivered event is handled once.
func ExampleDeliver() {
	t := testenv.NewExampleTB()
	defer t.Done()
	ctx := context.Background()
	pool := inboxtest.NewDatabase(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id text PRIMARY KEY)`); err != nil {
		fmt.Println(err)
		return
	}
	charge := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, ev.AggregateID)
		return err
	}

	placed := ev("order-1", 1)
	deadLetters := inboxtest.Deliver(t, pool, inbox.Config{Name: "billing"}, charge, placed, placed)
	inboxtest.RequireProcessed(t, pool, "billing", placed.EventID)
	var charges int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&charges)
	fmt.Println("charges:", charges, "dead letters:", len(deadLetters))
	// Output: charges: 1 dead letters: 0
}
