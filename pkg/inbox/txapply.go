package inbox

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// Handler applies one event's side effects using tx, the transaction the
// inbox row is written in. It must not commit or roll back tx. An error
// wrapping ErrPermanent or event.ErrInvalid dead-letters the event at once;
// any other error is retried.
type Handler = engine.Handler

// BatchHandler is a handler that can also apply the new events of a batch
// at once, so that what it writes for them takes a statement or two instead
// of a few per event (NewBatchConsumer).
type BatchHandler = engine.BatchHandler

// Applying is one event a BatchHandler applies, with the context of its
// consumer span (a context per event, which is why it travels in a struct).
type Applying = engine.Applying
