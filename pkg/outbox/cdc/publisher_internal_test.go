package cdc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// NewPublisher builds the relay of its mode, hands it the shared fields
// its own config leaves zero, and never returns a nil Publisher without an
// error. The constructors touch no server, so a pool that cannot connect
// does.
func TestNewPublisherPicksTheRelayOfItsMode(t *testing.T) {
	t.Parallel()
	pool := testenv.LazyPool(t)
	shared := PublisherConfig{
		Topic:   func(string) string { return "shared.topic" },
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics: outbox.NewMetrics(nil),
		CDC:     Config{Slot: "orders_outbox"},
	}

	for _, mode := range []outbox.RelayMode{"", outbox.ModePoll} {
		cfg := shared
		cfg.Mode = mode
		cfg.Poll = outbox.RelayConfig{PollInterval: time.Minute}
		p, err := NewPublisher(pool, nopWriter{}, cfg)
		if err != nil {
			t.Fatalf("mode %q: %v", mode, err)
		}
		if pp, ok := p.(polling); !ok || pp.Relay == nil {
			t.Fatalf("mode %q: got %T, want the polling *outbox.Relay", mode, p)
		}
		// What NewPublisher handed outbox.NewRelay.
		c := cfg.poll()
		if got := c.Topic("order"); got != "shared.topic" {
			t.Errorf("mode %q: topic %q, want the shared one", mode, got)
		}
		if c.Logger != shared.Logger || c.Metrics != shared.Metrics {
			t.Errorf("mode %q: the relay did not get the shared logger and metrics", mode)
		}
		if c.PollInterval != time.Minute {
			t.Errorf("mode %q: PollInterval %v, want Poll's 1m", mode, c.PollInterval)
		}
	}

	for _, mode := range []outbox.RelayMode{outbox.ModeCDC, outbox.ModeWAL} {
		cfg := shared
		cfg.Mode = mode
		cfg.CDC.Topic = func(string) string { return "own.topic" }
		p, err := NewPublisher(pool, nopWriter{}, cfg)
		if err != nil {
			t.Fatalf("mode %q: %v", mode, err)
		}
		r, ok := p.(*Relay)
		if !ok {
			t.Fatalf("mode %q: got %T, want *Relay", mode, p)
		}
		if r.cfg.Mode != mode || r.cfg.Slot != "orders_outbox" {
			t.Errorf("mode %q: the relay streams in mode %q from slot %q", mode, r.cfg.Mode, r.cfg.Slot)
		}
		if got := r.cfg.Topic("order"); got != "own.topic" {
			t.Errorf("mode %q: topic %q, want CDC's own", mode, got)
		}
		if r.cfg.Logger != shared.Logger || r.cfg.Metrics != shared.Metrics {
			t.Errorf("mode %q: the relay did not get the shared logger and metrics", mode)
		}
	}
}

func TestNewPublisherRefuses(t *testing.T) {
	t.Parallel()
	pool := testenv.LazyPool(t)
	for _, tc := range []struct {
		name string
		cfg  PublisherConfig
		want string
	}{
		{"an unknown mode", PublisherConfig{Mode: "kafka-connect"}, `unknown relay mode "kafka-connect"`},
		{"a CDC mode that disagrees", PublisherConfig{Mode: outbox.ModeWAL, CDC: Config{Mode: outbox.ModeCDC}}, "CDC.Mode is \"cdc\", but Mode is \"wal\""},
		{"what outbox.NewRelay refuses", PublisherConfig{Poll: outbox.RelayConfig{BatchSize: -1}}, "RelayConfig.BatchSize is negative"},
		{"what NewRelay refuses", PublisherConfig{Mode: outbox.ModeCDC, CDC: Config{Slot: "Bad-Slot"}}, `slot name "Bad-Slot"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := NewPublisher(pool, nopWriter{}, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one with %q", err, tc.want)
			}
			if p != nil {
				t.Fatalf("Publisher = %#v with the error, want nil", p)
			}
		})
	}
}

// idle, the Publisher of a mode with no relay in this process, runs until
// its context ends.
func TestIdlePublisherRunsUntilItsContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- idle{}.Run(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("Run returned %v before its context ended", err)
	default:
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after its context ended, want nil", err)
	}
}

type nopWriter struct{}

func (nopWriter) WriteMessages(context.Context, ...kafka.Message) error { return errors.ErrUnsupported }
