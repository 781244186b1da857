package lease

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
)

// leasePlan is what the batch's lease transaction decided for a message.
type leasePlan int

const (
	// planAlone: the message is settled on its own (processLeased): it did
	// not decode, another worker holds its lease, or the batch's lease
	// transaction failed.
	planAlone leasePlan = iota
	// planRepeat: the message repeats an event id earlier in the batch (a
	// producer's retry): a duplicate, settled in its key's turn after the
	// first one.
	planRepeat
	// planSettled: a duplicate or a stale event; nothing to call.
	planSettled
	// planLeased: leased by the batch; call under the lease, then mark done
	// with the batch.
	planLeased
)

// leaseItem is one message of a batch handled in lease mode.
type leaseItem struct {
	d        engine.Delivery
	ev       event.Envelope
	decoded  bool
	plan     leasePlan
	token    int64
	taken    bool      // an expired lease was taken over: check before calling
	leasedAt time.Time // when the batch's lease transaction began (planLeased)
	counts   [engine.NumOutcomes]int
	mismatch bool // planRepeat: its payload differs from the first's

	// After its key's turn:
	result  leaseResult
	outcome Outcome    // the side effect's, when result is leaseCalled
	span    trace.Span // the consumer span, ended once the message is settled
}

type leaseResult int

const (
	leaseSettled   leaseResult = iota // nothing more to do: duplicate, stale, dead letter, uncertain, or done alone
	leaseCalled                       // the side effect happened: mark done with the batch
	leaseAbandoned                    // unfinished; redelivered later
)

// Process settles a batch in lease mode:
//
//  1. one transaction leases every message it can (claimLeases), skips
//     duplicates and stale events, and advances the version guard;
//  2. each key's messages run their side effects in order, one after the
//     other, while distinct keys run concurrently (MaxInFlight bounds the
//     calls in flight across the consumer);
//  3. one transaction marks every called message done (markLeasesDone) and
//     records them (Effect.Done for each, or DoneBatch once).
//
// A message the batch cannot lease (another worker holds it, or the lease
// transaction failed) is settled alone, in its key's turn, as before
// batching. Every message is finished (done or abandoned) when it returns;
// a crash point firing returns a *crashError and abandons what is not
// marked done.
func (a *applier) Process(ctx context.Context, batch []engine.Delivery) error {
	start := time.Now()
	items := make([]*leaseItem, len(batch))
	for i, d := range batch {
		it := &leaseItem{d: d}
		if ev, err := event.FromKafka(d.Msg); err == nil {
			it.ev, it.decoded = ev, true
		}
		items[i] = it
	}
	a.leaseBatch(ctx, items)

	// Each key's turn, keys side by side. A crash stops every turn.
	turnCtx, stopTurns := context.WithCancel(ctx)
	defer stopTurns()
	var (
		order []string
		turns = map[string][]*leaseItem{}
		crash atomic.Pointer[engine.CrashError]
		wg    sync.WaitGroup
	)
	for _, it := range items {
		k := string(it.d.Msg.Key)
		if turns[k] == nil {
			order = append(order, k)
		}
		turns[k] = append(turns[k], it)
	}
	for _, k := range order {
		wg.Go(func() {
			mayBeHeld := false // an earlier message of the key was settled without its call: perhaps dead
			for i, it := range turns[k] {
				if mayBeHeld && it.plan == planLeased {
					// Leased with the batch, before the dead one died.
					switch parkedNow, err := a.parkLeasedIfHeld(turnCtx, it); {
					case err != nil:
						for _, rest := range turns[k][i:] {
							rest.result = leaseAbandoned
						}
						return
					case parkedNow:
						it.result = leaseSettled
						continue
					}
				}
				err := a.runLeased(turnCtx, it)
				if it.result == leaseSettled && (it.plan == planAlone || it.plan == planLeased) {
					mayBeHeld = true
				}
				var ce *engine.CrashError
				if errors.As(err, &ce) {
					crash.CompareAndSwap(nil, ce)
					stopTurns()
				}
				if err != nil {
					// The key's later messages wait for this one: they are
					// abandoned with it, and redelivered after it.
					for _, rest := range turns[k][i:] {
						rest.result = leaseAbandoned
					}
					return
				}
			}
		})
	}
	wg.Wait()

	var called []*leaseItem
	if crash.Load() == nil {
		for _, it := range items {
			if it.result == leaseCalled {
				called = append(called, it)
			}
		}
		if err := a.markBatchDone(ctx, called); err != nil {
			for _, it := range called {
				it.result = leaseAbandoned
			}
		}
	}
	var (
		counts  [engine.NumOutcomes]int
		done    []engine.Delivery
		batched int // settled through the batch, not alone (processLeased records those)
	)
	for _, it := range items {
		if it.span != nil {
			it.span.End()
		}
		if crash.Load() != nil || it.result == leaseAbandoned {
			it.d.Gen.Finish(it.d.Msg, false)
			continue
		}
		for i, n := range it.counts {
			counts[i] += n
		}
		if it.plan != planAlone {
			batched++
		}
		done = append(done, it.d)
	}
	if ce := crash.Load(); ce != nil {
		return ce
	}
	engine.Record(a.Config.Metrics, a.Config.Name, counts, batched, time.Since(start))
	return a.Committed(ctx, done)
}

// runLeased is one message's turn: settle it alone, or run its side effect
// under the batch's lease. It returns nil when the message may be finished
// (its result says whether it still needs marking done), errAbandoned or
// errLeaseLost (the key's later messages are then abandoned with it), or a
// *crashError.
func (a *applier) runLeased(ctx context.Context, it *leaseItem) error {
	if it.plan == planAlone {
		if err := a.processLeased(ctx, it.d); err != nil {
			it.result = leaseAbandoned
			return err
		}
		it.result = leaseSettled
		return nil
	}
	// Every delivery has its consumer span, a duplicate's too: in lease mode
	// the trace shows each time the third party's payment was considered.
	ctx, span := a.StartProcess(ctx, it.d.Msg, it.ev)
	it.span = span
	switch it.plan {
	case planSettled:
		it.result = leaseSettled
		return nil
	case planRepeat:
		if it.mismatch {
			a.PayloadMismatch(ctx, it.ev.EventID)
		}
		it.result = leaseSettled
		return nil
	}
	if err := a.Upcast(&it.ev); err != nil {
		it.counts[engine.DeadLettered]++
		it.result = leaseSettled
		if err := a.deadLetterLeased(ctx, it.d, &it.ev, err, engine.LeaseRef{Token: it.token, MayHaveCalled: it.taken}); err != nil {
			it.result = leaseAbandoned
			return err
		}
		return nil
	}
	outcome, settled, err := a.underLease(ctx, it.d, it.ev, it.token, it.taken, it.leasedAt, &it.counts)
	switch {
	case err != nil:
		it.result = leaseAbandoned
		return err
	case settled:
		it.result = leaseSettled
	default:
		it.result, it.outcome = leaseCalled, outcome
	}
	return nil
}

// markBatchDone marks every called message done, and records them with the
// Effect (Done for each, or DoneBatch once), in one transaction. The side
// effects are behind it, so when that transaction fails each message is
// marked alone, which waits out an outage; it returns an error only when
// the messages must be abandoned (ctx ended).
func (a *applier) markBatchDone(ctx context.Context, called []*leaseItem) error {
	if len(called) == 0 {
		return nil
	}
	ids, tokens := make([][16]byte, len(called)), make([]int64, len(called))
	for i, it := range called {
		ids[i], tokens[i] = it.ev.EventID, it.token
	}
	err := pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		rows, err := state.TakeQuery(ctx, tx, &state.DoneBatch, a.Config.Name, ids, tokens)
		if err != nil {
			return engine.DBErrors.Translate("marking leases done", err)
		}
		marked, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
		if err != nil {
			return engine.DBErrors.Translate("marking leases done", err)
		}
		ours := make(map[uuid.UUID]bool, len(marked))
		for _, id := range marked {
			ours[id] = true
		}
		done := make([]DoneEvent, 0, len(marked))
		for _, it := range called {
			if !ours[it.ev.EventID] {
				a.Refused(ctx, &state.DoneBatch, it.ev.EventID, "the lease was taken over")
				a.leaseTakenOver(ctx, it.ev)
				continue
			}
			done = append(done, DoneEvent{Event: it.ev, Outcome: it.outcome})
		}
		return a.recordDone(ctx, tx, done)
	})
	if err == nil {
		a.DB.OK(ctx, "")
		return nil
	}
	if engine.IsOutage(err) {
		a.DB.Fail(ctx, "mark_done", err)
	}
	for _, it := range called {
		if err := a.settleDone(ctx, it.d, it.ev, it.token, it.outcome); err != nil {
			return err
		}
	}
	return nil
}

// parkLeasedIfHeld parks a message the batch leased when an earlier
// message of its aggregate died after the batch's lease transaction (its
// call failed for good): the lease is given up and the message parked.
// It reports whether it parked it; an error abandons it.
func (a *applier) parkLeasedIfHeld(ctx context.Context, it *leaseItem) (bool, error) {
	var parkedNow bool
	err := pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		parkedNow = false
		pd, err := a.ParkCheck(ctx, tx, &it.ev)
		if err != nil || pd.Verdict != engine.ParkIt {
			return err
		}
		unleased, err := state.Take(ctx, tx, &state.Unlease, a.Config.Name, it.ev.EventID, it.token)
		if err != nil {
			return engine.DBErrors.Translate("parking a leased message", err)
		}
		if !unleased {
			a.Refused(ctx, &state.Unlease, it.ev.EventID, "the lease was taken over")
			return nil // taken over: its new holder decides
		}
		parkedNow = true
		return a.Park(ctx, tx, it.d.Msg, &it.ev, pd.BlockedBy)
	})
	if err != nil {
		if engine.IsOutage(err) {
			a.DB.Fail(ctx, "park", err)
		}
		return false, err
	}
	if parkedNow {
		it.counts[engine.ParkedOutcome]++
	}
	return parkedNow, nil
}
