package inbox

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// DeadKeyPolicy says what a consumer does with the later messages of an
// aggregate whose earlier message is dead.
type DeadKeyPolicy = engine.DeadKeyPolicy

const (
	// DeadKeyPark parks them until the dead message is requeued and applied,
	// then applies them in order. The default, and the only safe choice
	// when a later event depends on an earlier one (a refund on its capture,
	// a status on the order's creation).
	DeadKeyPark = engine.DeadKeyPark

	// DeadKeySkipAhead applies them at once, as if the dead message were
	// not there; a requeued dead message is still applied when it comes
	// back, after its successors. For consumers whose events of one
	// aggregate are independent of each other or carry the whole state
	// (a projection that keeps the latest snapshot, notifications, an
	// audit log).
	DeadKeySkipAhead = engine.DeadKeySkipAhead
)
