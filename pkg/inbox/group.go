package inbox

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// GroupConfig names the topic a Consumer reads and the Kafka consumer group
// it reads it in. Zero fields take the documented defaults; negative ones
// are refused by Validate.
type GroupConfig = engine.GroupConfig
