package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox/internal/dlt"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/kafkaerr"
	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/pgerr"
)

// Writer publishes dead letters; *kafka.Writer satisfies it.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// reasonClass is the reason label of a dead letter: ev is nil when the
// message did not decode.
func reasonClass(ev *event.Envelope, reason error) string {
	switch {
	case errors.Is(reason, event.ErrInvalid) && ev == nil:
		return ReasonUndecodable
	case errors.Is(reason, event.ErrInvalid):
		return ReasonInvalid
	case isStale(reason):
		return ReasonStale
	case errors.Is(reason, ErrPermanent), errors.Is(reason, errDBRefused), pgerr.IsPermanent(reason):
		return ReasonPermanent
	default:
		return ReasonExhausted
	}
}

// DeadLetterBodyLimit is how much of a message's value a dead letter keeps
// when the dead-letter topic refuses the whole message (too large for the
// writer or the topic): the record then carries the first DeadLetterBodyLimit
// bytes and the HeaderDLTTruncated header, so the partition can move on and
// the message is still visible, with its coordinates, for an operator.
const DeadLetterBodyLimit = 64 << 10

// PublishDeadLetter publishes m to the dead-letter topic with the reason. It
// retries while the broker is unreachable, until it succeeds or ctx ends
// (then it returns an error, the offset is not committed, and the message
// is redelivered later); a message the topic refuses as it is goes there
// truncated, which it reports (the inbox then keeps the original whole, so
// that a requeue sends it back whole). It runs outside any transaction (see
// dueDeadLetter).
func (s *Shared) PublishDeadLetter(ctx context.Context, m kafka.Message, ev *event.Envelope, reason error) (stored DLStored, err error) {
	truncated := false
	topic := s.deadLetterTopic(m)
	dltHeaders := []kafka.Header{
		{Key: dlt.HeaderDLTReason, Value: []byte(truncate(reason.Error(), 4<<10))},
		{Key: dlt.HeaderDLTConsumer, Value: []byte(s.Config.Name)},
		{Key: dlt.HeaderDLTTopic, Value: []byte(m.Topic)},
		{Key: dlt.HeaderDLTPartition, Value: []byte(fmt.Sprint(m.Partition))},
		{Key: dlt.HeaderDLTOffset, Value: []byte(fmt.Sprint(m.Offset))},
		{Key: dlt.HeaderDLTFailedAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	}
	dl := kafka.Message{Topic: topic, Key: m.Key, Value: m.Value,
		Headers: append(append([]kafka.Header{}, m.Headers...), dltHeaders...)}
	for attempt := 1; ; attempt++ {
		err := s.dlq.WriteMessages(ctx, dl)
		if err == nil {
			s.kafka.OK(ctx, "dead_letter")
			stored = dlWhole
			if truncated {
				stored = dlTruncated
			}
			break
		}
		if kafkaerr.IsMessageError(err) && !truncated {
			// Too large (or otherwise refused) as it is: keep the
			// coordinates, the reason and the start of the body.
			truncated = true
			dl = truncatedDeadLetter(dl, m, dltHeaders)
			s.Config.Logger.WarnContext(ctx, "inbox dead-letters a message truncated; the topic refused it whole",
				slog.String("consumer", s.Config.Name), slog.String("topic", m.Topic), slog.Int("partition", m.Partition),
				slog.Int64("offset", m.Offset), slog.Int("bytes", len(m.Value)), slog.Any("error", err))
			continue
		}
		if kafkaerr.IsMessageError(err) {
			// Even the truncated record is refused: nothing more can be
			// kept in Kafka; the log line and the counter are the record.
			s.Config.Logger.ErrorContext(ctx, "inbox could not dead-letter a message even truncated; its inbox row and the kept original are the record",
				slog.String("consumer", s.Config.Name), slog.String("topic", m.Topic), slog.Int("partition", m.Partition),
				slog.Int64("offset", m.Offset), slog.Any("reason", reason), slog.Any("error", err))
			stored = dlNotStored
			break
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("inbox %s: dead-lettering %s/%d/%d: %w", s.Config.Name, m.Topic, m.Partition, m.Offset, err)
		}
		s.kafka.Fail(ctx, "dead_letter", err)
		if !retry.Sleep(ctx, retry.Backoff(attempt, s.Config.BackoffMin, s.Config.BackoffMax)) {
			return 0, fmt.Errorf("inbox %s: dead-lettering %s/%d/%d: %w", s.Config.Name, m.Topic, m.Partition, m.Offset, err)
		}
	}
	s.Config.Metrics.deadLettered.WithLabelValues(s.Config.Name, reasonClass(ev, reason)).Inc()
	log := s.Config.Logger.With(slog.String("consumer", s.Config.Name), slog.String("topic", m.Topic),
		slog.Int("partition", m.Partition), slog.Int64("offset", m.Offset), slog.String("dead_letter_topic", topic),
		slog.Any("error", reason))
	if ev == nil {
		log.ErrorContext(ctx, "inbox dead-lettered a message it keeps no inbox row for")
		return stored, nil
	}
	log.ErrorContext(ctx, "inbox dead-lettered an event", slog.String("event_id", ev.EventID.String()),
		slog.String("event_type", ev.EventType))
	return stored, nil
}

// deadLetterTopic is where m's dead letter goes.
func (s *Shared) deadLetterTopic(m kafka.Message) string {
	if s.Config.DeadLetterTopic != "" {
		return s.Config.DeadLetterTopic
	}
	return m.Topic + ".dlt"
}

// DLStored is what the dead-letter topic holds of a dead letter.
type DLStored int

const (
	dlWhole     DLStored = iota + 1 // the message, whole
	dlTruncated                     // its first DeadLetterBodyLimit bytes (HeaderDLTTruncated)
	dlNotStored                     // nothing: it refused even the truncated record
)

// LeaseRef is the lease a dead letter is written under: its fencing token
// (0: none, the message was not leased) and whether a call may have landed.
type LeaseRef struct {
	Token         int64
	MayHaveCalled bool
}

// DLProgress is how far a dead letter got: published (not to publish again
// when only its row failed), and what the topic holds of it (anything but
// the whole message: the inbox keeps the original).
type DLProgress struct {
	published bool
	stored    DLStored
}

// RecordDeadLetter records the dead_lettered inbox row of a decoded event
// whose dead letter is published, in tx: under lease (its token) in lease
// mode, or as a new row (or a requeued one that died again). A row that
// moved on meanwhile — another member applied the event while this one
// waited on the dead-letter topic, or took the lease over — is left alone:
// the write is refused (counted, logged), and nothing holds the aggregate.
func (s *Shared) RecordDeadLetter(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, reason error, lease LeaseRef, stored DLStored) error {
	// In a savepoint: a row Postgres refuses (its fields are what the
	// decoder let through) must not fail the transaction; the message is in
	// the dead-letter topic either way.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("recording a dead letter: %w", err)
	}
	var (
		tr      = &state.DeadLetter
		changed bool
	)
	if lease.Token > 0 {
		tr = &state.DeadLetterLeased
		changed, err = state.Take(ctx, sp, tr, s.Config.Name, ev.EventID, lease.Token, reason.Error(), lease.MayHaveCalled, ev.AggregateType)
	} else {
		changed, err = state.Take(ctx, sp, tr, s.Config.Name, ev.EventID, ev.EventType, ev.AggregateType, ev.AggregateID,
			ev.AggregateVersion, m.Topic, m.Partition, m.Offset, reason.Error(), []byte(ev.Payload), lease.MayHaveCalled)
	}
	if err == nil && !changed {
		_ = sp.Rollback(ctx)
		s.Refused(ctx, tr, ev.EventID, "the message was settled (or leased) by another worker while its dead letter was published")
		return nil
	}
	if err == nil && !isStale(reason) {
		// Its aggregate's later messages are parked until it is requeued
		// (not behind a stale one: they come after what was applied).
		err = s.holdDeadKey(ctx, sp, ev)
	}
	if err == nil && stored != dlWhole {
		err = s.keepOriginal(ctx, sp, m, ev, stored == dlTruncated)
	}
	if err != nil {
		_ = sp.Rollback(ctx)
		if IsOutage(err) || ctx.Err() != nil {
			return fmt.Errorf("recording a dead letter: %w", err)
		}
		s.Config.Logger.ErrorContext(ctx, "inbox could not record a dead letter's inbox row; it is in the dead-letter topic only",
			slog.String("consumer", s.Config.Name), slog.String("topic", m.Topic), slog.Int("partition", m.Partition),
			slog.Int64("offset", m.Offset), slog.String("event_id", ev.EventID.String()), slog.Any("row_error", err))
		return nil
	}
	return sp.Commit(ctx)
}

// DueDeadLetter is what settle returns, as its error, for a message that is
// to be dead-lettered. The caller ends its transaction first (committing
// the batch-mates settled before it) and only then dead-letters it
// (deadLetterSettled): the publish may wait out a whole Kafka outage, and no
// transaction, row lock or connection may be held through that. Nothing is
// lost in between: the message's offset is committed only after its dead
// letter is published and recorded, so a crash before then redelivers it
// and dead-letters it again (a duplicate dead letter, never a missing one).
type DueDeadLetter struct {
	Ev     *event.Envelope // nil: the message did not decode
	Reason error
}

func (e *DueDeadLetter) Error() string { return "to be dead-lettered: " + e.Reason.Error() }

// DeadLetterAlone publishes m's dead letter outside any transaction, then
// records its inbox row in a transaction of its own, under lease. progress
// says how far an earlier call for this dead letter got, and is updated: a
// caller retrying after the database failed does not publish it again.
func (s *Shared) DeadLetterAlone(ctx context.Context, m kafka.Message, ev *event.Envelope, reason error, lease LeaseRef, progress *DLProgress) error {
	if !progress.published {
		stored, err := s.PublishDeadLetter(ctx, m, ev, reason)
		if err != nil {
			return err
		}
		progress.published, progress.stored = true, stored
	}
	if ev == nil {
		return nil
	}
	return pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		return s.RecordDeadLetter(ctx, tx, m, ev, reason, lease, progress.stored)
	})
}

// keepOriginal keeps m whole, in tx, for the requeue of its dead letter,
// which the dead-letter topic took only truncated (inTopic) or not at all.
func (s *Shared) keepOriginal(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, inTopic bool) error {
	headers, err := dlt.EncodeHeaders(m.Headers)
	if err != nil {
		return err
	}
	_, err = state.Take(ctx, tx, &state.KeepOriginal, s.Config.Name, ev.EventID, m.Topic, m.Partition, m.Offset, m.Key, m.Value, headers, inTopic,
		s.deadLetterTopic(m))
	return err
}

// deadLetterSettled dead-letters d (deadLetterAlone), waiting out the
// database being unreachable, and counts it. It returns errAbandoned when
// ctx ends or d's generation is dropped first.
func (s *Shared) deadLetterSettled(ctx context.Context, d Delivery, due *DueDeadLetter) error {
	start := time.Now()
	var progress DLProgress
	for outages := 0; ; {
		err := s.DeadLetterAlone(ctx, d.Msg, due.Ev, due.Reason, LeaseRef{}, &progress)
		switch {
		case err == nil:
			s.DB.OK(ctx, "")
			var counts [NumOutcomes]int
			counts[DeadLettered]++
			s.Config.Metrics.record(s.Config.Name, counts, 1, time.Since(start))
			return nil
		case ctx.Err() != nil:
			return ErrAbandoned
		case IsOutage(err):
			s.DB.Fail(ctx, "dead_letter", err)
			outages++
			if err := Wait(ctx, d.Gen, retry.Backoff(outages, s.Config.BackoffMin, s.Config.BackoffMax)); err != nil {
				return err
			}
		default:
			// The dead letter is published; only its transaction failed.
			// Moving on is all that is left to do.
			s.Config.Logger.ErrorContext(ctx, "inbox dead-lettered a message but could not commit afterwards; moving on",
				slog.String("consumer", s.Config.Name), slog.Any("error", err))
			return nil
		}
	}
}

// truncatedDeadLetter is dl cut down to what any topic takes: the key and
// the original headers cut to 1 KiB each, the first DeadLetterBodyLimit bytes
// of the value, and the dead-letter headers.
func truncatedDeadLetter(dl, m kafka.Message, dltHeaders []kafka.Header) kafka.Message {
	out := kafka.Message{Topic: dl.Topic, Key: []byte(truncate(string(m.Key), 1<<10))}
	out.Value = m.Value
	if len(out.Value) > DeadLetterBodyLimit {
		out.Value = out.Value[:DeadLetterBodyLimit]
	}
	for _, h := range m.Headers {
		out.Headers = append(out.Headers, kafka.Header{Key: truncate(h.Key, 256), Value: []byte(truncate(string(h.Value), 1<<10))})
	}
	out.Headers = append(out.Headers, dltHeaders...)
	out.Headers = append(out.Headers, kafka.Header{Key: dlt.HeaderDLTTruncated, Value: []byte(fmt.Sprint(len(m.Value)))})
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
