package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/kafkasafe"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A consumer whose dead-letter topic does not exist refuses to start,
// naming it, instead of consuming until its first bad message, which would
// then wait at the head of its partition for a topic nobody created
// (issue 31). Created beside the topic, the same consumer runs.
func TestRunRefusesAMissingDeadLetterTopic(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	topic := testenv.NewTopic(t, f.Brokers, 1) // and no topic.dlt
	h := func(context.Context, pgx.Tx, event.Envelope) error { return nil }
	src := inbox.GroupConfig{Brokers: f.Brokers, Topic: topic, Group: testenv.Name("group")}
	c, err := inbox.NewConsumer(f.Pool, src, f.Writer, h, inbox.Config{Name: "no-dlt"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	if ctx.Err() != nil {
		t.Fatal("Run consumed until its deadline; want it refused at start")
	}
	testenv.CheckErr(t, err, "dead-letter topic does not exist")
	testenv.CheckErr(t, err, topic+".dlt")
	testenv.CheckErr(t, err, "kafkasafe.EnsureTopics")

	// Config.DeadLetterTopic names the one that is checked.
	c, err = inbox.NewConsumer(f.Pool, src, f.Writer, h, inbox.Config{Name: "no-dlt", DeadLetterTopic: topic + ".elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.CheckErr(t, c.Run(ctx), topic+".elsewhere")

	testenv.NewTopicNamed(t, f.Brokers, topic+kafkasafe.DeadLetterSuffix, 1)
	c, err = inbox.NewConsumer(f.Pool, src, f.Writer, h, inbox.Config{Name: "no-dlt"})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 20*time.Second, "the new topic to take a message", func() (bool, error) {
		return f.Writer.WriteMessages(ctx, event.ToKafka(topic, inboxtesting.NewEvent("a", 1))) == nil, nil
	})
	testenv.WaitFor(t, 20*time.Second, "the consumer to handle a message", func() (bool, error) {
		select {
		case err := <-done:
			t.Fatalf("with its dead-letter topic, Run returned early: %v", err)
		default:
		}
		var n int
		err := f.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox_messages WHERE consumer = 'no-dlt'`).Scan(&n)
		return n == 1, err
	})
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run = %v after its context ended, want nil", err)
	}
}
