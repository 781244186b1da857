package outbox_test

import "github.com/onceflow/onceflow/pkg/outbox/internal/outboxtesting"

// The helpers these tests share with the other outbox packages' tests
// (internal/outboxtesting), by the names the tests call them.
type (
	row             = outboxtesting.Row
	benchWireCounts = outboxtesting.WireCounts
	benchRate       = outboxtesting.Rate
	benchClock      = outboxtesting.Clock
	nopWriter       = outboxtesting.NopWriter
	switchWriter    = outboxtesting.SwitchWriter
)

const (
	day          = outboxtesting.Day
	week         = outboxtesting.Week
	lagLoad      = outboxtesting.LagLoad
	lagWarmUp    = outboxtesting.LagWarmUp
	lagProducers = outboxtesting.LagProducers
	lagIdle      = outboxtesting.LagIdle
	bigBlob      = outboxtesting.BigBlob
)

var (
	snapshot          = outboxtesting.Snapshot
	seedRows          = outboxtesting.SeedRows
	idsOf             = outboxtesting.IDsOf
	tableIDs          = outboxtesting.TableIDs
	equalIDs          = outboxtesting.EqualIDs
	benchCountingPool = outboxtesting.CountingPool
	benchTrickle      = outboxtesting.Trickle
	newBenchClock     = outboxtesting.NewClock
	benchLogger       = outboxtesting.Logger
	benchOrderPlaced  = outboxtesting.OrderPlaced
	firstMessage      = outboxtesting.FirstMessage
	exampleSetup      = outboxtesting.ExampleSetup
	runRelay          = outboxtesting.RunRelay
	newRelayEnv       = outboxtesting.NewRelayEnv
	newOutboxDB       = outboxtesting.NewOutboxDB
	newOutboxDBURL    = outboxtesting.NewOutboxDBURL
	newEvent          = outboxtesting.NewEvent
	countRows         = outboxtesting.CountRows
	newSmallTopic     = outboxtesting.NewSmallTopic
	newTopicWithMax   = outboxtesting.NewTopicWithMax
	raiseTopicMax     = outboxtesting.RaiseTopicMax
	newWideWriter     = outboxtesting.NewWideWriter
	blob              = outboxtesting.Blob
	onTopic           = outboxtesting.OnTopic
	enqueue           = outboxtesting.Enqueue
	collect           = outboxtesting.Collect
)
