package inbox

import (
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// AdminOption changes how ListDeadLetters and RequeueDeadLetters reach Kafka.
type AdminOption = engine.AdminOption

// WithDialer makes ListDeadLetters and RequeueDeadLetters connect with d:
// pass a dialer with the TLS and SASL settings so a cluster that wants TLS or SASL is
// read the way the service's consumers read it. A nil d keeps the default.
func WithDialer(d *kafka.Dialer) AdminOption {
	return engine.WithDialer(d)
}
