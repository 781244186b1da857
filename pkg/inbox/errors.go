package inbox

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// ErrPermanent marks a handler error that no retry can fix.
var ErrPermanent = engine.ErrPermanent

// Permanent wraps err so the consumer dead-letters instead of retrying.
func Permanent(err error) error {
	return engine.Permanent(err)
}
