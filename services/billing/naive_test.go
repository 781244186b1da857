package billing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/billing"
)

// flakyReader stands in for a consumer-group reader while Kafka is away: its
// first fetches and its first commit fail, as kafka-go's do during an outage
// (no real broker can be made to fail one call on cue), then it hands out
// msgs and blocks until ctx ends.
type flakyReader struct {
	mu                       sync.Mutex
	fetchFailures, commitErr int
	msgs                     []kafka.Message
	commits                  int
}

func (r *flakyReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	r.mu.Lock()
	if r.fetchFailures > 0 {
		r.fetchFailures--
		r.mu.Unlock()
		return kafka.Message{}, errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	}
	if len(r.msgs) > 0 {
		m := r.msgs[0]
		r.msgs = r.msgs[1:]
		r.mu.Unlock()
		return m, nil
	}
	r.mu.Unlock()
	<-ctx.Done()
	return kafka.Message{}, ctx.Err()
}

func (r *flakyReader) CommitMessages(context.Context, ...kafka.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.commits++
	if r.commitErr > 0 {
		r.commitErr--
		return errors.New("[27] Rebalance In Progress")
	}
	return nil
}

func (r *flakyReader) committed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.commits
}

// The naive consumer keeps running through failed fetches and commits: only
// its context ends it, so the proofs' count of process exits measures the
// inbox against it fairly.
func TestNaiveConsumerRidesOutFetchAndCommitErrors(t *testing.T) {
	_, pool := newBilling(t)
	var (
		mu      sync.Mutex
		handled []uuid.UUID
	)
	evs := []event.Envelope{placed(uuid.New()), placed(uuid.New())}
	r := &flakyReader{fetchFailures: 3, commitErr: 1,
		msgs: []kafka.Message{event.ToKafka("orders.events", evs[0]), event.ToKafka("orders.events", evs[1])}}
	c := &billing.NaiveConsumer{Pool: pool, Reader: r, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handle: func(_ context.Context, _ pgx.Tx, ev event.Envelope) error {
			mu.Lock()
			defer mu.Unlock()
			handled = append(handled, ev.EventID)
			return nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	testinfra.WaitFor(t, 20*time.Second, "both messages handled and committed after 3 failed fetches", func() (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("Run returned %v before its context ended", err)
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 2 && r.committed() == 2, nil
	})
	if handled[0] != evs[0].EventID || handled[1] != evs[1].EventID {
		t.Fatalf("handled %v, want %s then %s", handled, evs[0].EventID, evs[1].EventID)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v once its context ended, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context ending")
	}
}
