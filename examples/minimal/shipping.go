package main

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations are the service's own tables, applied with pgmigrate.Up at
// start and handed to the kits (testenv.Migration) in its tests, so the
// tests run the schema production runs.
var Migrations = pgmigrate.Dir(migrationFiles)

// MigrationsTable tracks Migrations, apart from the libraries' tables
// (outbox.MigrationsTable, inbox.MigrationsTable).
const MigrationsTable = "minimal_schema_migrations"

const (
	insertOrder    = `INSERT INTO orders (id, amount_cents) VALUES ($1, $2)`
	insertShipment = `INSERT INTO shipments (order_id) VALUES ($1)`
	countShipments = `SELECT count(*) FROM shipments WHERE order_id = $1`
)

// handle is the consumer's handler. It runs in the transaction that
// records the event in the inbox: a redelivery finds that row and never
// comes here again, so the shipment is created once.
func handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	switch ev.EventType {
	case "OrderPlaced":
		_, err := tx.Exec(ctx, insertShipment, ev.AggregateID)
		return err
	default:
		// Retrying cannot teach this handler a new event type: dead-letter
		// it at once (an operator requeues it once a handler exists),
		// instead of MaxAttempts retries with backoff.
		return inbox.Permanent(fmt.Errorf("no handler for event type %q", ev.EventType))
	}
}
