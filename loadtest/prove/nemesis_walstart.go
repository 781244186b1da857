package prove

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// The opt-in fault NemWALStart (issue 30, deliver 4): every billing
// instance started together on a slot that does not exist, as a WAL-only
// service's first deploy is, while a transaction holds an xid open. Creating
// a logical slot takes one instance; the others find it being created
// (42710), and the slot is consistent only once every transaction running
// at its creation ended. An instance whose Prepare returned before that
// (issue 30, bug 3) emits events no stream ever decodes: orders the
// checker then finds charged but never settled.
//
// The slot is dropped only when that loses nothing: with every instance
// stopped, nothing emitted after the slot's confirmed position (a peek at
// the slot finds no message or insert); otherwise they start together on
// the slot they have, and the record says so. Its record in
// outbox_cdc_slots goes too: a first start, not a lost slot (whose window
// WAL-only mode reports lost).

// walStartKeys are what a walstart step holds: every billing instance (no
// pause, kill or leave of one while they are all stopped) and billing's
// scale-up.
func (n *nemesisRun) walStartKeys() []string {
	n.procMu.RLock()
	defer n.procMu.RUnlock()
	keys := []string{NemWALStart, "join/" + KindBilling}
	for _, pr := range n.p.Billings {
		keys = append(keys, pr.Name)
	}
	return keys
}

// walStart stops every billing instance, drops billing's slot and its
// record if nothing is left unconfirmed in it, opens a transaction with an
// xid, starts every instance at once, and ends the transaction after d.
func (n *nemesisRun) walStart(ctx context.Context, d time.Duration) (string, error) {
	n.procMu.RLock()
	procs := append([]*Proc(nil), n.p.Billings...)
	n.procMu.RUnlock()
	for _, pr := range procs {
		pr.Stop()
	}
	cctx := context.WithoutCancel(ctx)
	slot, pool := n.p.BillingDB, n.p.billingPool
	var (
		unconfirmed int
		err         error
	)
	// 55006 while a stopped instance's walsender is still going away.
	for try := 0; try == 0 || (err != nil && strings.Contains(err.Error(), "55006") && try < 50); try++ {
		if try > 0 {
			hold(cctx, 100*time.Millisecond)
		}
		err = pool.QueryRow(cctx, `
			SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
			    'proto_version', '1', 'publication_names', 'outbox_events_pub', 'messages', 'true')
			WHERE get_byte(data, 0) IN (ascii('M'), ascii('I'))`, slot).Scan(&unconfirmed)
	}
	dropped := "the slot kept"
	switch {
	case err != nil:
		dropped += fmt.Sprintf(" (not peeked: %v)", err)
	case unconfirmed > 0:
		dropped += fmt.Sprintf(" (%d changes not confirmed yet)", unconfirmed)
	default:
		if _, err := pool.Exec(cctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
			dropped += fmt.Sprintf(" (not dropped: %v)", err)
			break
		}
		if _, err := pool.Exec(cctx, `DELETE FROM outbox_cdc_slots WHERE slot_name = $1`, slot); err != nil {
			return "slot dropped, its record not", err
		}
		dropped = "slot and record dropped"
	}

	tx, err := pool.Begin(cctx)
	if err != nil {
		return dropped, err
	}
	defer tx.Rollback(cctx) //nolint:errcheck // committed below
	var xid string
	if err := tx.QueryRow(cctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		return dropped, err
	}
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, pr := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = startPatiently(ctx, pr, false)
		}()
	}
	hold(ctx, d)
	if err := tx.Commit(cctx); err != nil {
		return dropped, err
	}
	wg.Wait()
	detail := fmt.Sprintf("%d billing instances stopped, %s, started together while transaction %s stayed open %.1fs",
		len(procs), dropped, xid, d.Seconds())
	for _, err := range errs {
		if err != nil {
			return detail, err
		}
	}
	return detail, nil
}
