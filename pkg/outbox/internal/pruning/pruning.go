// Package pruning removes the outbox's old rows: the batches and the
// statements of one prune. It is shared by the service's loop
// (outbox.NewPruner) and the operator's one-shot prune (outboxadmin.Prune),
// which live in different packages; outboxadmin imports outbox, never the
// reverse, so what both run sits here, below both.
package pruning

import (
	"context"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/prune"
)

// Rows is what one prune removes: outbox.PruneConfig's fields, with its
// defaults applied and validated by the caller.
type Rows struct {
	Retention        time.Duration
	PendingRetention time.Duration
	BatchSize        int
	Archive          bool
}

// Once removes published rows older than r.Retention (by published_at), and
// with r.PendingRetention set pending rows older than that (by created_at),
// deleting or archiving them per r.Archive, oldest first in batches of
// r.BatchSize, and returns how many it removed. storeErr translates a
// driver's error (it is the calling package's store boundary), given what
// was being done.
//
// On error the count is what the batches before the failure removed.
func Once(ctx context.Context, db prune.Execer, r Rows, storeErr func(what string, err error) error) (int, error) {
	total, err := prune.Batches(ctx, db, pruneStatement(publishedDoomed, r.Archive), r.Retention, r.BatchSize)
	if err != nil {
		return total, storeErr("pruning published events", err)
	}
	if r.PendingRetention == 0 {
		return total, nil
	}
	n, err := prune.Batches(ctx, db, pruneStatement(pendingDoomed, r.Archive), r.PendingRetention, r.BatchSize)
	if err != nil {
		err = storeErr("pruning pending events", err)
	}
	return total + n, err
}
