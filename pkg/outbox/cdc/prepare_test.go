package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// In WAL-only mode nothing but the replication slot keeps what Emit writes,
// so a service that takes writes before its relay's slot first exists loses
// them: `make prove` found billing, started in RELAY_MODE=wal, charging its
// first order and emitting the payment 170 ms before its relay created the
// slot, and the third party never heard of it. Prepare, which a service
// calls before it takes writes, creates the slot; what is emitted after it
// returns is published once Run starts, however late.
func TestWALModeEventsEmittedAfterPrepareArePublished(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	cfg := e.config()
	cfg.StatusInterval = 100 * time.Millisecond
	p, err := cdc.NewPublisher(e.Pool, e.W, cdc.PublisherConfig{Mode: outbox.ModeWAL, CDC: cfg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	// The service takes writes at once; its relay is slow to start.
	emit(t, e.Pool, newEvent("first", 1))
	testenv.RunInBackground(t, "Run", p.Run)
	emit(t, e.Pool, newEvent("second", 1))
	testenv.WaitFor(t, 30*time.Second, "both events on the topic", func() (bool, error) {
		return e.C.Distinct() == 2, nil
	})
	// Prepare on a slot that exists leaves it as it is.
	if err := p.Prepare(ctx); err != nil {
		t.Fatalf("Prepare with the slot in use: %v", err)
	}
}
