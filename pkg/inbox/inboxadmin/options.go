package inboxadmin

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/pgerr"
)

// Option changes how ListDeadLetters and RequeueDeadLetters reach Kafka.
type Option func(*adminOptions)

type adminOptions struct{ dialer *kafka.Dialer }

// WithDialer makes ListDeadLetters and RequeueDeadLetters connect with d:
// pass a dialer with the TLS and SASL settings so a cluster that wants TLS or SASL is
// read the way the service's consumers read it. A nil d keeps the default.
func WithDialer(d *kafka.Dialer) Option {
	return func(o *adminOptions) { o.dialer = d }
}

// adminDialer is the dialer opts ask for, or plain TCP with a 5s timeout.
// A caller's dialer is copied with that timeout when it has none, because a
// zero timeout would leave a dial to a dead broker to the context alone.
func adminDialer(opts []Option) *kafka.Dialer {
	var o adminOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.dialer == nil {
		return &kafka.Dialer{Timeout: 5 * time.Second}
	}
	if o.dialer.Timeout == 0 {
		d := *o.dialer
		d.Timeout = 5 * time.Second
		return &d
	}
	return o.dialer
}

// Writer sends requeued messages back to their topics; *kafka.Writer
// satisfies it.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// dbErrors names the database errors of the operator's verbs, as the
// consumer names its own: a database that cannot be reached satisfies
// pgerr.IsUnavailable either way.
var dbErrors = pgerr.StoreErrors{
	Unavailable: errors.New("inbox database unavailable"),
	Invalid:     errors.New("inbox database refused the data"),
}
