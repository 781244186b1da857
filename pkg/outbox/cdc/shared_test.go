package cdc_test

import "github.com/onceflow/onceflow/pkg/outbox/internal/outboxtesting"

// The helpers these tests share with the other outbox packages' tests
// (internal/outboxtesting), by the names the tests call them.
type (
	row          = outboxtesting.Row
	benchRate    = outboxtesting.Rate
	switchWriter = outboxtesting.SwitchWriter
	relayEnv     = outboxtesting.RelayEnv
	collector    = outboxtesting.Collector
	nopWriter    = outboxtesting.NopWriter
)

const (
	day          = outboxtesting.Day
	lagLoad      = outboxtesting.LagLoad
	lagWarmUp    = outboxtesting.LagWarmUp
	lagProducers = outboxtesting.LagProducers
	bigBlob      = outboxtesting.BigBlob
)

var (
	seedRows         = outboxtesting.SeedRows
	idsOf            = outboxtesting.IDsOf
	tableIDs         = outboxtesting.TableIDs
	equalIDs         = outboxtesting.EqualIDs
	benchTrickle     = outboxtesting.Trickle
	benchTrickleFrom = outboxtesting.TrickleFrom
	newBenchClock    = outboxtesting.NewClock
	benchLogger      = outboxtesting.Logger
	firstMessage     = outboxtesting.FirstMessage
	exampleSetup     = outboxtesting.ExampleSetup
	runRelay         = outboxtesting.RunRelay
	newRelayEnv      = outboxtesting.NewRelayEnv
	newOutboxDB      = outboxtesting.NewOutboxDB
	newEvent         = outboxtesting.NewEvent
	countRows        = outboxtesting.CountRows
	newSmallTopic    = outboxtesting.NewSmallTopic
	newTopicWithMax  = outboxtesting.NewTopicWithMax
	raiseTopicMax    = outboxtesting.RaiseTopicMax
	newWideWriter    = outboxtesting.NewWideWriter
	blob             = outboxtesting.Blob
	onTopic          = outboxtesting.OnTopic
	enqueue          = outboxtesting.Enqueue
	collect          = outboxtesting.Collect
	adminDB          = outboxtesting.NewOutboxDB
)
