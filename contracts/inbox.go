package contracts

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// Validating wraps a consumer's handler so that an event off the channel's
// contract is dead-lettered with the schema error as its reason: the inbox
// dead-letters a handler's inbox.Permanent error at once, with the error's
// text as the dlt-reason header. The inbox's own decoding (event.FromKafka)
// has already refused what the envelope's parsing cannot read; this adds
// what only the document says (the payload's fields and formats, the
// event types and versions of the channel). The event is checked as the
// relays would publish it (event.ToKafka of the decoded envelope): the
// record's own extra headers are not seen here.
//
// It is opt-in, outside pkg/inbox, so that a consumer that does not want a
// schema validator in its binary does not get one; a service that does
// calls it in run, around the handler it gives inbox.NewConsumer.
func (ch *Channel) Validating(h inbox.Handler) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		m := event.ToKafka(ch.Address, ev)
		if _, err := ch.Check(m, 0); err != nil {
			return inbox.Permanent(fmt.Errorf("off the contract: %w", err))
		}
		return h(ctx, tx, ev)
	}
}
