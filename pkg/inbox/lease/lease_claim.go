package lease

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"bytes"
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
)

// leaseBatch runs the batch's lease transaction and sets each item's plan.
// When the transaction fails, every item is left to planAlone, which waits
// out an outage and charges failures to the message that caused them.
func (a *applier) leaseBatch(ctx context.Context, items []*leaseItem) {
	seen := map[uuid.UUID]*leaseItem{}
	var fresh []*leaseItem // decoded, first of their event id in the batch
	for _, it := range items {
		switch first := seen[it.ev.EventID]; {
		case !it.decoded:
		case first != nil:
			it.plan = planRepeat
			it.counts[engine.Duplicate]++
			if !bytes.Equal(first.ev.Payload, it.ev.Payload) {
				it.mismatch = true
			}
		default:
			seen[it.ev.EventID] = it
			fresh = append(fresh, it)
		}
	}
	if len(fresh) == 0 {
		return
	}
	var notes []func()
	plans := make(map[uuid.UUID]*leaseItem, len(fresh))
	leasedAt := time.Now() // before the transaction: its leases run from no earlier
	err := pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		clear(plans)
		if err := a.watchServer(ctx, tx); err != nil {
			return err
		}
		// A held aggregate's messages are left to planAlone, where each is
		// parked or released on its own (settle.go).
		fresh, err := a.unheld(ctx, tx, fresh)
		if err != nil || len(fresh) == 0 {
			return err
		}
		n := len(fresh)
		ids, types, aggTypes, aggs, versions := make([][16]byte, n), make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
		topics, partitions, offsets, payloads := make([]string, n), make([]int32, n), make([]int64, n), make([][]byte, n)
		sent := make([]time.Time, n)
		for i, it := range fresh {
			ev, m := it.ev, it.d.Msg
			ids[i], types[i], aggTypes[i], aggs[i], versions[i] = ev.EventID, ev.EventType, ev.AggregateType, ev.AggregateID, ev.AggregateVersion
			topics[i], partitions[i], offsets[i], payloads[i], sent[i] = m.Topic, int32(m.Partition), m.Offset, []byte(ev.Payload), m.Time
		}
		rows, err := state.TakeQuery(ctx, tx, &state.LeaseBatch, a.Config.Name, ids, types, aggTypes, aggs, versions, topics, partitions, offsets, payloads,
			a.leaseCfg.LeaseOwner, a.leaseCfg.LeaseTTL.Microseconds(), sent)
		if err != nil {
			return engine.DBErrors.Translate("leasing a batch", err)
		}
		type claim struct {
			id            [16]byte
			token         int64
			taken         bool // an expired lease was taken over
			mayHaveCalled bool // taken, or sent before a server switch (lease_server.go)
		}
		claims, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claim, error) {
			var cl claim
			return cl, r.Scan(&cl.id, &cl.token, &cl.taken, &cl.mayHaveCalled)
		})
		if err != nil {
			return engine.DBErrors.Translate("leasing a batch", err)
		}
		byID := make(map[uuid.UUID]*leaseItem, n)
		for _, it := range fresh {
			byID[it.ev.EventID] = it
		}
		var leased, unclaimed []uuid.UUID
		tokens := map[uuid.UUID]claim{}
		for _, cl := range claims {
			tokens[cl.id] = cl
			leased = append(leased, cl.id)
		}
		for _, it := range fresh {
			if _, ok := tokens[it.ev.EventID]; !ok {
				unclaimed = append(unclaimed, it.ev.EventID)
			}
		}
		// Unclaimed: settled already (a duplicate), or leased to a live
		// worker (its own turn waits for that lease).
		var dups []event.Envelope
		if len(unclaimed) > 0 {
			rows, err := tx.Query(ctx, leaseStates, a.Config.Name, unclaimed)
			if err != nil {
				return engine.DBErrors.Translate("reading leases", err)
			}
			var (
				id     [16]byte
				status string
				until  *time.Time
			)
			if _, err := pgx.ForEachRow(rows, []any{&id, &status, &until}, func() error {
				it := byID[id]
				if (status == state.StatusLeased && until != nil) || status == state.StatusRequeued {
					return nil // planAlone: it waits for that lease, or applies the requeued letter
				}
				dups = append(dups, it.ev)
				d := *it
				d.plan = planSettled
				d.counts[engine.Duplicate]++
				plans[id] = &d
				return nil
			}); err != nil {
				return engine.DBErrors.Translate("reading leases", err)
			}
		}
		if err := a.CheckPayloads(ctx, tx, dups...); err != nil {
			return err
		}
		// The version guard, for the messages leased for the first time.
		evs := make([]event.Envelope, 0, len(leased))
		outs := make([]engine.Outcome, 0, len(leased))
		for _, it := range fresh {
			cl, ok := tokens[it.ev.EventID]
			if !ok {
				continue
			}
			d := *it
			d.plan, d.token, d.taken, d.leasedAt = planLeased, cl.token, cl.taken || cl.mayHaveCalled, leasedAt
			plans[it.ev.EventID] = &d
			out := engine.Duplicate // taken over: guarded when it was first leased
			if !cl.taken {
				out = engine.Processed
			}
			evs, outs = append(evs, it.ev), append(outs, out)
		}
		if !a.Config.DisableVersionGuard {
			if notes, err = a.GuardBatch(ctx, tx, evs, outs); err != nil {
				return engine.DBErrors.Translate("checking aggregate versions", err)
			}
			for i, out := range outs {
				if out == engine.Stale {
					p := plans[evs[i].EventID]
					p.plan = planSettled
					p.counts[engine.Stale]++
				}
			}
		}
		return nil
	})
	if err != nil {
		if engine.IsOutage(err) {
			a.DB.Fail(ctx, "lease", err)
		} else if ctx.Err() == nil {
			a.Config.Logger.DebugContext(ctx, "inbox lease batch falls back to one lease per message",
				slog.String("consumer", a.Config.Name), slog.Any("error", err))
		}
		return
	}
	a.DB.OK(ctx, "")
	for _, note := range notes {
		note()
	}
	for _, it := range fresh {
		if p := plans[it.ev.EventID]; p != nil {
			it.plan, it.token, it.taken, it.leasedAt, it.counts = p.plan, p.token, p.taken, p.leasedAt, p.counts
		}
	}
}

// unheld returns the items of fresh whose aggregates are not held.
func (a *applier) unheld(ctx context.Context, tx pgx.Tx, fresh []*leaseItem) ([]*leaseItem, error) {
	evs := make([]event.Envelope, len(fresh))
	for i, it := range fresh {
		evs[i] = it.ev
	}
	held, err := a.HeldKeys(ctx, tx, evs)
	if err != nil || len(held) == 0 {
		return fresh, err
	}
	out := make([]*leaseItem, 0, len(fresh))
	for _, it := range fresh {
		if !held[engine.AggregateKey{Type: it.ev.AggregateType, ID: it.ev.AggregateID}] {
			out = append(out, it)
		}
	}
	return out, nil
}
