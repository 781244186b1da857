package outboxadmin_test

import "github.com/onceflow/onceflow/pkg/outbox/internal/outboxtesting"

// The helpers these tests share with the other outbox packages' tests
// (internal/outboxtesting), by the names the tests call them.
type (
	row    = outboxtesting.Row
	seeded = outboxtesting.Seeded
)

const (
	day  = outboxtesting.Day
	week = outboxtesting.Week
)

var (
	snapshot     = outboxtesting.Snapshot
	seedRows     = outboxtesting.SeedRows
	idsOf        = outboxtesting.IDsOf
	tableIDs     = outboxtesting.TableIDs
	equalIDs     = outboxtesting.EqualIDs
	exampleSetup = outboxtesting.ExampleSetup
	newOutboxDB  = outboxtesting.NewOutboxDB
)
