package engine

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/tracectx"
)

// invoke upcasts ev and runs the handler in tx, in m's consumer span.
func (a *TxApplier) invoke(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope) error {
	if err := a.Upcast(ev); err != nil {
		return err
	}
	return a.handleTraced(ctx, tx, m, *ev)
}

// handleTraced runs the handler inside the message's consumer span.
func (a *TxApplier) handleTraced(ctx context.Context, tx pgx.Tx, m kafka.Message, ev event.Envelope) error {
	ctx, span := a.StartProcess(ctx, m, ev)
	err := a.handle(ctx, tx, ev)
	tracectx.End(span, err)
	return err
}
