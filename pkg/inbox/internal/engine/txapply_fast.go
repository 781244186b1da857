package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/tracectx"
)

// fastBatch settles a whole batch in one transaction with set-based inbox
// work: one INSERT for every message's inbox row, one locked read and one
// upsert for the version guard, then the handlers one after another without
// savepoints. It is all or nothing: if any message is undecodable, needs an
// upcaster that fails, finds a version gap under GapWait, or its handler
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
