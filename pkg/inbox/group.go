package inbox

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// The defaults of GroupConfig's fields, which a zero field takes.
const (
	DefaultStartOffset       = engine.DefaultStartOffset
	DefaultSessionTimeout    = engine.DefaultSessionTimeout
	DefaultHeartbeatInterval = engine.DefaultHeartbeatInterval
	DefaultRebalanceTimeout  = engine.DefaultRebalanceTimeout
	DefaultCommitInterval    = engine.DefaultCommitInterval
	DefaultMaxWait           = engine.DefaultMaxWait
	DefaultMinBytes          = engine.DefaultMinBytes
	DefaultMaxBytes          = engine.DefaultMaxBytes
	DefaultQueueCapacity     = engine.DefaultQueueCapacity
	DefaultReadBackoffMin    = engine.DefaultReadBackoffMin
	DefaultReadBackoffMax    = engine.DefaultReadBackoffMax

	// DefaultDialTimeout is the dial timeout of the default Dialer.
	DefaultDialTimeout = engine.DefaultDialTimeout
)

// GroupConfig names the topic a Consumer reads and the Kafka consumer group
// it reads it in. Zero fields take the documented defaults; negative ones
// are refused by Validate.
type GroupConfig = engine.GroupConfig
