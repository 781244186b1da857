package inbox

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// Upcaster converts the payload of EventType from version From to From+1.
// Register one per step; the consumer applies them in a chain, so handlers
// only ever see the current version.
type Upcaster = engine.Upcaster

// Config configures a Consumer, in either mode (a lease-mode consumer's own
// knobs are in pkg/inbox/lease's Config). Zero fields take the documented defaults;
// negative ones are refused by Validate.
type Config = engine.Config
