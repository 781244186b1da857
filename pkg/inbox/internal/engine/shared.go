package engine

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
)

// Shared is what the two appliers work with, built once by NewConsumer or
// pkg/inbox/lease's lease.NewConsumer and handed to the applier it picks: the database and the
// consumer's settings, the outages of the database and of Kafka, the
// dead-letter writer, the upcasters, and the aggregates whose parked
// messages may be released once a batch is settled. Its methods are the
// helpers both appliers call (guard.go, park.go, deadletter.go, trace.go,
// delivery.go); the dispatcher (consumer.go) reads it too, and the appliers
// never call back into the dispatcher.
type Shared struct {
	Pool      *pgxpool.Pool
	Config    Config
	dlq       Writer
	upcasters map[string]map[int]Upcaster
	kafka, DB *Fault
	standby   *Fault   // nil unless Config.CommitReplicated
	Released  releases // aggregates whose parked messages may be released (park.go)
	// ReservesVersions says the applier advances the version guard before
	// a message's effect (the lease applier does, when it leases it), so a
	// dead letter moves the guard back below the dead message (holdDeadKey).
	ReservesVersions bool
}

// newShared checks the upcasters and sets up the metrics and the outage
// trackers of a consumer whose cfg has its defaults.
func newShared(pool *pgxpool.Pool, dlq Writer, cfg Config) (*Shared, error) {
	s := &Shared{Pool: pool, Config: cfg, dlq: dlq, upcasters: map[string]map[int]Upcaster{}}
	cfg.Metrics.init(cfg.Name)
	m := cfg.Metrics
	s.kafka = NewFault("kafka", cfg.Name, cfg.Logger, cfg.ErrorLogInterval, m.kafkaErrors, m.kafkaConnected)
	s.DB = NewFault("database", cfg.Name, cfg.Logger, cfg.ErrorLogInterval, m.dbErrors, m.dbConnected)
	if cfg.CommitReplicated {
		s.standby = NewFault("standbys that have its work", cfg.Name, cfg.Logger, cfg.ErrorLogInterval, m.standbyErrors, m.standbyConnected)
	}
	for _, u := range cfg.Upcasters {
		if u.EventType == "" || u.From < 1 || u.Convert == nil {
			return nil, fmt.Errorf("inbox: upcaster %+v needs an event type, a version >= 1 and a Convert", u)
		}
		if s.upcasters[u.EventType] == nil {
			s.upcasters[u.EventType] = map[int]Upcaster{}
		}
		s.upcasters[u.EventType][u.From] = u
	}
	return s, nil
}

// Committed is called once msgs' database work committed: it passes the
// crash point, then lets their offsets be committed.
func (s *Shared) Committed(ctx context.Context, msgs []Delivery) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := faultpoint.Pass(ctx, faultpoint.InboxAfterCommit); err != nil {
		for _, d := range msgs {
			d.Gen.Finish(d.Msg, false)
		}
		return &CrashError{err}
	}
	for _, d := range msgs {
		d.Gen.Finish(d.Msg, true)
	}
	return nil
}

// Refused counts and logs a writer that lost its right to tr for id: the
// row had moved on (settled by another member, taken over), so it changed
// nothing.
func (s *Shared) Refused(ctx context.Context, tr *state.Transition, id uuid.UUID, why string) {
	s.Config.Metrics.refused.WithLabelValues(s.Config.Name, tr.Name).Inc()
	s.Config.Logger.WarnContext(ctx, "inbox transition refused: the row moved on; this writer changed nothing",
		slog.String("consumer", s.Config.Name), slog.String("transition", tr.Name), slog.String("by", tr.By),
		slog.String("event_id", id.String()), slog.String("why", why))
}
