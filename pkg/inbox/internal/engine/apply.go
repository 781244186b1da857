// The transactional applier, a message's second stage: the inbox row, the
// version guard and the handler in one transaction, a batch set-based
// first, then a savepoint per message; and Shared, what both appliers are
// handed.

package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"
	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/internal/tracectx"
	"github.com/onceflow/onceflow/pkg/pgerr"
)

// Handler applies one event's side effects using tx, the transaction the
// inbox row is written in. It must not commit or roll back tx. An error
// wrapping ErrPermanent or event.ErrInvalid dead-letters the event at once;
// any other error is retried.
type Handler func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error

// BatchHandler is a handler that can also apply the new events of a batch
// at once, so that what it writes for them takes a statement or two instead
// of a few per event (NewBatchConsumer).
type BatchHandler interface {
	// Handle applies one event, as a Handler does; the consumer calls it
	// for each message it settles on its own (a batch that failed, a
	// retry, a dead letter's replay).
	Handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error
	// HandleBatch applies evs, new events of one batch in the order they
	// were fetched, in tx: exactly what Handle would do for each, one after
	// the other. Each comes with the context of its consumer span, the
	// trace its effects continue. It must not commit or roll back tx. An
	// error rolls the batch back, and the consumer then settles its
	// messages one by one with Handle.
	HandleBatch(ctx context.Context, tx pgx.Tx, evs []Applying) error
}

// Applying is one event a BatchHandler applies, with the context of its
// consumer span (a context per event, which is why it travels in a struct).
type Applying struct {
	Ctx   context.Context
	Event event.Envelope
}

// TxApplier is the transactional applier, NewConsumer's: each message's
// inbox row, version guard and handler commit in one transaction, a batch
// of messages in as few transactions as it can (process), the fast path
// first (fastBatch); both paths run the handler the same way
// (invoke, invokeBatch).
type TxApplier struct {
	*Shared
	handle Handler
	// handleBatch applies a batch's new events at once on the fast path
	// (NewBatchConsumer); nil: handle, one by one.
	handleBatch func(ctx context.Context, tx pgx.Tx, evs []Applying) error
}

// Process handles batch in as few transactions as it can: one, unless
// a message fails transiently or is to be dead-lettered; then what came
// before it commits, it is retried alone with backoff or dead-lettered with
// no transaction open (dueDeadLetter), and the rest continues in a new
// transaction.
// Every message of batch is finished (done or abandoned) when it returns.
func (a *TxApplier) Process(ctx context.Context, batch []Delivery) (err error) {
	defer func() {
		for _, d := range batch {
			d.Gen.Finish(d.Msg, false)
		}
	}()
	for len(batch) > 0 {
		n, due := a.tryBatch(ctx, batch)
		if err := a.Committed(ctx, batch[:n]); err != nil {
			batch = batch[n:]
			return err
		}
		batch = batch[n:]
		if len(batch) == 0 {
			return nil
		}
		var aloneErr error
		if due != nil {
			aloneErr = a.deadLetterSettled(ctx, batch[0], due)
		} else {
			aloneErr = a.processAlone(ctx, batch[0])
		}
		if aloneErr != nil {
			if ctx.Err() != nil {
				return aloneErr
			}
			// Its generation was dropped; the others may be of a newer one.
			// The later messages of its key in its generation go with it:
			// applied now, they would make the redelivered one look stale.
			batch = abandonKey(batch)
			continue
		}
		err := a.Committed(ctx, batch[:1])
		batch = batch[1:]
		if err != nil {
			return err
		}
	}
	return nil
}

// Health is nil: the transactional applier calls nothing but the database,
// whose outages the dispatcher reports.
func (a *TxApplier) Health() error { return nil }

// abandonKey finishes batch[0] unfinished, with every later message of its
// key and generation, and returns the rest of the batch in order.
func abandonKey(batch []Delivery) []Delivery {
	first := batch[0]
	first.Gen.Finish(first.Msg, false)
	rest := make([]Delivery, 0, len(batch)-1)
	for _, d := range batch[1:] {
		if d.Gen == first.Gen && bytes.Equal(d.Msg.Key, first.Msg.Key) {
			d.Gen.Finish(d.Msg, false)
			continue
		}
		rest = append(rest, d)
	}
	return rest
}

func messages(batch []Delivery) []kafka.Message {
	ms := make([]kafka.Message, len(batch))
	for i, d := range batch {
		ms[i] = d.Msg
	}
	return ms
}

// tryBatch handles batch in one transaction. It first tries the fast path
// (fastBatch); when that cannot settle the whole batch, it handles the batch
// again with a savepoint per message, and returns how many messages it
// settled (handled or skipped) before the first one that failed transiently
// or is to be dead-lettered; those are committed. due is that next
// message's dead letter, to publish now that the transaction has ended;
// nil when it failed transiently. When the database cannot be reached it
// settles none, and processAlone waits the outage out.
func (a *TxApplier) tryBatch(ctx context.Context, batch []Delivery) (n int, due *DueDeadLetter) {
	ms := messages(batch)
	if len(ms) > 1 && a.fastBatch(ctx, ms) {
		a.DB.OK(ctx, "")
		return len(ms), nil
	}
	start := time.Now()
	tx, err := a.Pool.Begin(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.DB.Fail(ctx, "begin", err)
		}
		return 0, nil
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	var counts [NumOutcomes]int
	for _, m := range ms {
		out, err := a.Settle(ctx, tx, m, 1)
		if err != nil {
			// A dead letter, or a transient failure: commit what came
			// before, then dead-letter this one, or retry it alone.
			errors.As(err, &due)
			break
		}
		counts[out]++
		n++
	}
	if err := tx.Commit(ctx); err != nil {
		if pgerr.IsUnavailable(err) {
			a.DB.Fail(ctx, "commit", err)
		} else if ctx.Err() == nil {
			a.Config.Logger.WarnContext(ctx, "inbox batch commit failed; retrying its messages one by one",
				slog.String("consumer", a.Config.Name), slog.Any("error", err))
		}
		return 0, nil
	}
	a.DB.OK(ctx, "")
	a.Config.Metrics.record(a.Config.Name, counts, n, time.Since(start))
	return n, due
}

// processAlone retries one failing message in its own transactions with
// backoff. Failures of the message (its handler, its commit) count toward
// MaxAttempts, after which it is dead-lettered; the database being
// unreachable does not count and is waited out with capped backoff. It
// returns errAbandoned when ctx ends or the message's generation is dropped.
func (a *TxApplier) processAlone(ctx context.Context, d Delivery) error {
	attempt, outages := 1, 0 // the batch was attempt 1
	var lastErr error
	for {
		delay := retry.Backoff(attempt, a.Config.BackoffMin, a.Config.BackoffMax)
		if outages > 0 {
			delay = retry.Backoff(outages, a.Config.BackoffMin, a.Config.BackoffMax)
		}
		if err := Wait(ctx, d.Gen, delay); err != nil {
			return err
		}
		if attempt >= a.Config.MaxAttempts && lastErr != nil {
			// The last allowed attempt failed outside the handler (its
			// commit): dead-letter without running it again.
			return a.deadLetterSettled(ctx, d, &DueDeadLetter{Reason: fmt.Errorf("gave up after %d attempts: %w", attempt, lastErr)})
		}
		start := time.Now()
		tx, err := a.Pool.Begin(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ErrAbandoned
			}
			a.DB.Fail(ctx, "begin", err)
			outages++
			continue
		}
		out, err := a.Settle(ctx, tx, d.Msg, attempt+1)
		op := "handle"
		if err == nil {
			op = "commit"
			err = tx.Commit(ctx)
		}
		if err == nil {
			a.DB.OK(ctx, "")
			var counts [NumOutcomes]int
			counts[out]++
			a.Config.Metrics.record(a.Config.Name, counts, 1, time.Since(start))
			return nil
		}
		_ = tx.Rollback(context.Background())
		var due *DueDeadLetter
		switch {
		case errors.As(err, &due):
			return a.deadLetterSettled(ctx, d, due)
		case ctx.Err() != nil:
			return ErrAbandoned
		case IsOutage(err):
			a.DB.Fail(ctx, op, err)
			outages++
		default:
			a.DB.OK(ctx, "")
			outages = 0
			attempt++
			if op == "commit" {
				lastErr = err
				a.Config.Metrics.failures.WithLabelValues(a.Config.Name).Inc()
				a.Config.Logger.WarnContext(ctx, "inbox could not commit a message's transaction; retrying",
					slog.String("consumer", a.Config.Name), slog.String("topic", d.Msg.Topic), slog.Int("partition", d.Msg.Partition),
					slog.Int64("offset", d.Msg.Offset), slog.Int("attempt", attempt), slog.Any("error", err))
			} else {
				lastErr = nil // settle logged and counted the handler's failure
			}
		}
	}
}

// Settle decides one message inside tx: handled, duplicate, stale, or to be
// dead-lettered (a *dueDeadLetter error, which the caller publishes after
// ending tx). Any other error is a transient failure (the savepoint is
// rolled back and the caller retries); attempt counts the tries so far, and
// the last allowed one dead-letters instead. A failure
// because the database is unreachable is never the message's: it is
// returned for the caller to wait out, whatever the attempt.
func (a *TxApplier) Settle(ctx context.Context, tx pgx.Tx, m kafka.Message, attempt int) (Outcome, error) {
	ev, err := event.FromKafka(m)
	if err != nil {
		return DeadLettered, &DueDeadLetter{Reason: err}
	}
	sp, err := tx.Begin(ctx) // a savepoint
	if err != nil {
		return 0, err
	}
	out, err := a.apply(ctx, sp, m, &ev, attempt)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return 0, err
		}
		return out, nil
	}
	if rbErr := sp.Rollback(ctx); rbErr != nil {
		return 0, rbErr
	}
	if ctx.Err() != nil || IsOutage(err) {
		return 0, err
	}
	a.Config.Metrics.failures.WithLabelValues(a.Config.Name).Inc()
	permanent := IsPermanent(err)
	if !permanent && attempt < a.Config.MaxAttempts {
		a.Config.Logger.WarnContext(ctx, "inbox handler failed; retrying",
			slog.String("consumer", a.Config.Name), slog.String("event_id", ev.EventID.String()),
			slog.String("event_type", ev.EventType), slog.Int("attempt", attempt), slog.Any("error", err))
		return 0, err
	}
	if !permanent {
		err = fmt.Errorf("gave up after %d attempts: %w", attempt, err)
	}
	return DeadLettered, &DueDeadLetter{Ev: &ev, Reason: err}
}

// apply is the inbox insert, the version guard, the upcasters and the
// handler, all in tx; the first attempt records the hop (inbox_hop_seconds).
func (a *TxApplier) apply(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, attempt int) (Outcome, error) {
	var reapplied bool // a requeued row: the operator sent it back
	var was []byte     // and that row as it was, for state.Repark
	err := tx.QueryRow(ctx, state.Record.SQL, a.Config.Name, ev.EventID, ev.EventType, ev.AggregateType, ev.AggregateID,
		ev.AggregateVersion, m.Topic, m.Partition, m.Offset, []byte(ev.Payload)).Scan(&reapplied, &was)
	recorded := err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil {
		return 0, DBErrors.Translate("recording in inbox", err)
	}
	if !recorded {
		a.Config.Logger.DebugContext(ctx, "inbox duplicate", slog.String("consumer", a.Config.Name),
			slog.String("event_id", ev.EventID.String()), slog.String("event_type", ev.EventType))
		if err := a.CheckPayloads(ctx, tx, *ev); err != nil {
			return 0, err
		}
		return Duplicate, nil
	}
	pd, err := a.ParkCheck(ctx, tx, ev)
	if err != nil {
		return 0, err
	}
	if pd.Release {
		a.Released.Add(AggregateKey{ev.AggregateType, ev.AggregateID})
	}
	switch pd.Verdict {
	case ParkIt, AlreadyParked:
		// Not applied: no inbox row either, so that its release applies it;
		// but a requeued row (a stale dead letter's requeue, which holds
		// nothing, behind another dead message) is put back requeued, never
		// deleted: its release reapplies it as the requeue it is.
		tr, args := &state.Unrecord, []any{a.Config.Name, ev.EventID}
		if reapplied {
			tr, args = &state.Repark, []any{a.Config.Name, ev.EventID, was, nil}
		}
		if _, err := state.Take(ctx, tx, tr, args...); err != nil {
			return 0, DBErrors.Translate("parking a message", err)
		}
		if pd.Verdict == AlreadyParked {
			return Duplicate, nil
		}
		return ParkedOutcome, a.Park(ctx, tx, m, ev, pd.BlockedBy)
	case ProceedRequeued:
		if _, err := state.Take(ctx, tx, &state.DropHold, a.Config.Name, ev.EventID); err != nil {
			return 0, DBErrors.Translate("releasing a requeued message's aggregate", err)
		}
	}
	if !a.Config.DisableVersionGuard {
		isStale, err := a.GuardVersion(ctx, tx, ev, pd.Verdict == ProceedRequeued || reapplied)
		if err != nil || isStale {
			return Stale, err
		}
	}
	if attempt == 1 {
		a.Config.Metrics.observeHop(a.Config.Name, ev.OccurredAt)
	}
	if err := a.invoke(ctx, tx, m, ev); err != nil {
		return 0, err
	}
	return Processed, nil
}

// fastBatch settles a whole batch in one transaction with set-based inbox
// work: one INSERT for every message's inbox row, one locked read and one
// upsert for the version guard, then the handlers one after another without
// savepoints. It is all or nothing: if any message is undecodable, needs an
// upcaster that fails, finds a version gap (AcceptGaps false), or its handler
// fails, the transaction is rolled back and fastBatch returns false, and the
// caller takes the savepoint path, which settles each message on its own
// (retry, dead letter). Handlers run in a transaction that may roll back, as
// they always may.
func (a *TxApplier) fastBatch(ctx context.Context, batch []kafka.Message) bool {
	start := time.Now()
	evs := make([]event.Envelope, len(batch))
	for i, m := range batch {
		ev, err := event.FromKafka(m)
		if err != nil {
			return false
		}
		evs[i] = ev
	}
	tx, err := a.Pool.Begin(ctx)
	if err != nil {
		return false
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit

	// A held aggregate (a dead message, parked messages) is decided message
	// by message, on the savepoint path.
	if held, err := a.HeldKeys(ctx, tx, evs); err != nil || len(held) > 0 {
		return false
	}
	fresh, err := a.insertBatch(ctx, tx, batch, evs)
	if err != nil {
		a.fastPathFailed(ctx, "recording in inbox", err)
		return false
	}
	outs := make([]Outcome, len(batch))
	seen := make(map[uuid.UUID]bool, len(batch))
	var dups []event.Envelope
	for i, ev := range evs {
		if !fresh[ev.EventID] || seen[ev.EventID] {
			outs[i] = Duplicate
			dups = append(dups, ev)
		}
		seen[ev.EventID] = true
	}
	if err := a.CheckPayloads(ctx, tx, dups...); err != nil {
		a.fastPathFailed(ctx, "comparing duplicates' payloads", err)
		return false
	}
	var notes []func()
	if !a.Config.DisableVersionGuard {
		if notes, err = a.GuardBatch(ctx, tx, evs, outs); err != nil {
			a.fastPathFailed(ctx, "checking aggregate versions", err)
			return false
		}
	}
	var counts [NumOutcomes]int
	for i := range evs {
		counts[outs[i]]++
		if outs[i] != Processed || a.handleBatch != nil {
			continue
		}
		a.Config.Metrics.observeHop(a.Config.Name, evs[i].OccurredAt)
		if err := a.invoke(ctx, tx, batch[i], &evs[i]); err != nil {
			a.fastPathFailed(ctx, "handling "+evs[i].EventID.String(), err)
			return false
		}
	}
	if a.handleBatch != nil {
		if err := a.invokeBatch(ctx, tx, batch, evs, outs); err != nil {
			a.fastPathFailed(ctx, "handling the batch", err)
			return false
		}
	}
	if err := tx.Commit(ctx); err != nil {
		a.fastPathFailed(ctx, "committing", err)
		return false
	}
	for _, note := range notes {
		note()
	}
	if counts[Duplicate] > 0 {
		a.Config.Logger.DebugContext(ctx, "inbox duplicates", slog.String("consumer", a.Config.Name), slog.Int("count", counts[Duplicate]))
	}
	a.Config.Metrics.record(a.Config.Name, counts, len(batch), time.Since(start))
	return true
}

// invokeBatch runs handleBatch once for the batch's processed events, each
// upcast and in its consumer span, as invoke runs the handler for one.
func (a *TxApplier) invokeBatch(ctx context.Context, tx pgx.Tx, batch []kafka.Message, evs []event.Envelope, outs []Outcome) (err error) {
	var applying []Applying
	var spans []trace.Span
	defer func() {
		for _, span := range spans {
			tracectx.End(span, err)
		}
	}()
	for i := range evs {
		if outs[i] != Processed {
			continue
		}
		a.Config.Metrics.observeHop(a.Config.Name, evs[i].OccurredAt)
		if err := a.Upcast(&evs[i]); err != nil {
			return err
		}
		spanCtx, span := a.StartProcess(ctx, batch[i], evs[i])
		spans = append(spans, span)
		applying = append(applying, Applying{Ctx: spanCtx, Event: evs[i]})
	}
	if len(applying) == 0 {
		return nil
	}
	return a.handleBatch(ctx, tx, applying)
}

func (a *TxApplier) fastPathFailed(ctx context.Context, step string, err error) {
	a.Config.Logger.DebugContext(ctx, "inbox batch falls back to one savepoint per message",
		slog.String("consumer", a.Config.Name), slog.String("step", step), slog.Any("error", err))
}

// insertBatch records every message in the inbox in one statement and
// returns the ids that were new (a redelivered id finds its row and is not
// returned; within the batch, the first occurrence is the one inserted).
func (a *TxApplier) insertBatch(ctx context.Context, tx pgx.Tx, batch []kafka.Message, evs []event.Envelope) (map[uuid.UUID]bool, error) {
	n := len(batch)
	// [16]byte, not uuid.UUID: pgx encodes and decodes it natively instead of
	// through driver.Valuer, sql.Scanner and text.
	ids, types, aggTypes, aggs, versions := make([][16]byte, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]int64, 0, n)
	topics, partitions, offsets, payloads := make([]string, 0, n), make([]int32, 0, n), make([]int64, 0, n), make([][]byte, 0, n)
	// Each id once: an upsert may not touch a row twice in one statement,
	// and the first occurrence is the one recorded (the rest are
	// duplicates).
	first := make(map[uuid.UUID]bool, n)
	for i, m := range batch {
		ev := evs[i]
		if first[ev.EventID] {
			continue
		}
		first[ev.EventID] = true
		ids, types, aggTypes = append(ids, ev.EventID), append(types, ev.EventType), append(aggTypes, ev.AggregateType)
		aggs, versions = append(aggs, ev.AggregateID), append(versions, ev.AggregateVersion)
		topics, partitions = append(topics, m.Topic), append(partitions, int32(m.Partition))
		offsets, payloads = append(offsets, m.Offset), append(payloads, []byte(ev.Payload))
	}
	rows, err := state.TakeQuery(ctx, tx, &state.RecordBatch, a.Config.Name, ids, types, aggTypes, aggs, versions, topics, partitions, offsets, payloads)
	if err != nil {
		return nil, err
	}
	fresh := make(map[uuid.UUID]bool, n)
	var (
		id        [16]byte
		reapplied bool
		requeued  bool
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &reapplied}, func() error {
		fresh[uuid.UUID(id)] = true
		requeued = requeued || reapplied
		return nil
	}); err != nil {
		return nil, err
	}
	if requeued {
		// A requeued message is applied whatever the guard says: the
		// message-by-message path knows how (this transaction rolls back).
		return nil, errors.New("the batch holds a requeued message")
	}
	return fresh, nil
}

// invoke upcasts ev and runs the handler in tx, in m's consumer span.
func (a *TxApplier) invoke(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope) error {
	if err := a.Upcast(ev); err != nil {
		return err
	}
	return a.handleTraced(ctx, tx, m, *ev)
}

// handleTraced runs the handler inside the message's consumer span.
func (a *TxApplier) handleTraced(ctx context.Context, tx pgx.Tx, m kafka.Message, ev event.Envelope) error {
	ctx, span := a.StartProcess(ctx, m, ev)
	err := a.handle(ctx, tx, ev)
	tracectx.End(span, err)
	return err
}

// Shared is what the two appliers work with, built once by NewConsumer or
// pkg/inbox/lease's lease.NewConsumer and handed to the applier it picks: the database and the
// consumer's settings, the outages of the database and of Kafka, the
// dead-letter writer, the upcasters, and the aggregates whose parked
// messages may be released once a batch is settled. Its methods are the
// helpers both appliers call (settle.go, deadletter.go, observe.go,
// consume.go's delivery); the dispatcher (consume.go) reads it too, and the appliers
// never call back into the dispatcher.
type Shared struct {
	Pool      *pgxpool.Pool
	Config    Config
	dlq       Writer
	upcasters map[string]map[int]Upcaster
	kafka, DB *Fault
	standby   *Fault   // nil unless Config.CommitReplicated
	Released  releases // aggregates whose parked messages may be released (settle.go)
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
