package cdc

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/internal/knob"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// Publisher is what a service runs to get its outbox's events to Kafka,
// whatever the relay mode. Run publishes until ctx ends and returns nil
// then; an unreachable Kafka or Postgres is waited out, never returned.
// NewPublisher returns one for any mode (the polling *outbox.Relay in
// outbox.ModePoll, a *Relay in outbox.ModeCDC and outbox.ModeWAL), so
// that a service that offers every mode does not repeat the switch. The
// switch lives here, beside the log-based relay, so that package outbox,
// and a poll-only service, never compile the replication client.
type Publisher interface {
	// Prepare readies, before the service takes writes, what its events
	// need to be kept until Run publishes them. In outbox.ModeWAL that is
	// the replication slot: nothing but a slot holds what Emit writes, so
	// an event emitted before the slot first exists is lost. In the other
	// modes it does nothing. It retries an unreachable Postgres until ctx
	// ends, as Run does.
	Prepare(ctx context.Context) error
	Run(ctx context.Context) error
}

var _ Publisher = (*Relay)(nil)

// PublisherConfig configures NewPublisher: the mode, what the relay of any
// mode takes, and each relay's own knobs. Zero fields take the documented
// defaults.
type PublisherConfig struct {
	// Mode picks the relay: outbox.ModePoll an outbox.Relay,
	// outbox.ModeCDC and outbox.ModeWAL a Relay that streams in that mode.
	// Default outbox.ModePoll.
	Mode outbox.RelayMode
	// Topic, Logger and Metrics go to the relay of any mode, unless Poll or
	// CDC below sets its own; see outbox.RelayConfig for each one's meaning
	// and default.
	Topic   func(aggregateType string) string
	Logger  *slog.Logger
	Metrics *outbox.Metrics
	// Poll tunes the polling relay; it is ignored in the other modes.
	Poll outbox.RelayConfig
	// CDC tunes the log-based relay; it is ignored in outbox.ModePoll. A
	// service sets at least its Slot and ReplicationURL. Its Mode is
	// Mode's: a CDC whose Mode says otherwise is refused.
	CDC Config
}

// NewPublisher returns the relay of cfg.Mode for the outbox in pool,
// writing to w: what outbox.NewRelay returns in outbox.ModePoll, what
// NewRelay returns in outbox.ModeCDC and outbox.ModeWAL. It refuses what
// they refuse, and a mode it does not know; it never returns a nil
// Publisher without an error.
//
// In outbox.ModeDebezium no relay of this process publishes (Debezium
// streams the outbox from its own slot): NewPublisher returns a Publisher
// whose Run only waits for ctx to end, never a nil one, so that a service
// runs whatever it gets as one stage among its others.
func NewPublisher(pool *pgxpool.Pool, w outbox.Writer, cfg PublisherConfig) (Publisher, error) {
	knob.Default(&cfg.Mode, outbox.ModePoll)
	switch cfg.Mode {
	case outbox.ModePoll:
		r, err := outbox.NewRelay(pool, w, cfg.poll())
		if err != nil {
			return nil, err
		}
		return polling{r}, nil
	case outbox.ModeCDC, outbox.ModeWAL:
		c := cfg.CDC
		if c.Mode != "" && c.Mode != cfg.Mode {
			return nil, fmt.Errorf("outbox: PublisherConfig.CDC.Mode is %q, but Mode is %q: leave CDC.Mode empty", c.Mode, cfg.Mode)
		}
		c.Mode = cfg.Mode
		cfg.share(&c.Topic, &c.Logger, &c.Metrics)
		r, err := NewRelay(pool, w, c)
		if err != nil {
			return nil, err
		}
		return r, nil
	case outbox.ModeDebezium:
		return idle{}, nil
	}
	return nil, fmt.Errorf("outbox: unknown relay mode %q (poll, cdc, wal or debezium)", cfg.Mode)
}

// poll is the polling relay's config: Poll, with the shared fields it
// leaves zero taken from cfg.
func (cfg PublisherConfig) poll() outbox.RelayConfig {
	c := cfg.Poll
	cfg.share(&c.Topic, &c.Logger, &c.Metrics)
	return c
}

// share fills a relay config's fields that both relays take, where that
// config leaves them zero, from cfg.
func (cfg PublisherConfig) share(topic *func(string) string, logger **slog.Logger, metrics **outbox.Metrics) {
	if *topic == nil {
		*topic = cfg.Topic
	}
	if *logger == nil {
		*logger = cfg.Logger
	}
	if *metrics == nil {
		*metrics = cfg.Metrics
	}
}

// polling is the Publisher of outbox.ModePoll: the polling relay, which
// needs no Prepare, since the table keeps each row until it is published.
type polling struct{ *outbox.Relay }

func (polling) Prepare(context.Context) error { return nil }

// idle is the Publisher of a mode in which no relay of this process
// publishes: its Run waits for ctx to end.
type idle struct{}

func (idle) Prepare(context.Context) error { return nil }

func (idle) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
