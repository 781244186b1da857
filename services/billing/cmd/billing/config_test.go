package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestDebeziumRelayModeIsRefusedWithAReason: Debezium publishes orders'
// outbox only (docs/debezium), so billing given RELAY_MODE=debezium would
// charge orders and publish no payment event. It stops at once, saying so, before
// it reaches the database.
func TestDebeziumRelayModeIsRefusedWithAReason(t *testing.T) {
	// Without the check billing would start and serve: the timeout ends it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	env := map[string]string{"RELAY_MODE": "debezium"}
	err := run(ctx, nil, func(k string) string { return env[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "RELAY_MODE=debezium is for orders") {
		t.Fatalf("run with RELAY_MODE=debezium: %v, want the reason it is refused", err)
	}
}
