package lease_test

import (
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
)

// The fixture these tests share with the other inbox package's, from
// internal/inboxtesting, under the short names the tests use.

// fixture is inboxtesting's, with the methods only these tests add.
type fixture struct{ *inboxtesting.Fixture }

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return &fixture{inboxtesting.NewFixture(t)}
}

// startTraced is inboxtesting.StartTraced with the fixture of these tests.
func startTraced(t *testing.T) (*tracetest.SpanRecorder, *fixture, event.Envelope, *runUnder) {
	t.Helper()
	rec, f, ev, under := inboxtesting.StartTraced(t)
	return rec, &fixture{f}, ev, under
}

type runUnder = inboxtesting.RunUnder

var (
	runUntilCleanup      = inboxtesting.RunUntilCleanup
	newEvent             = inboxtesting.NewEvent
	handle               = inboxtesting.Handle
	lastMessage          = inboxtesting.LastMessage
	fastRetries          = inboxtesting.FastRetries
	checkOneConsumerSpan = inboxtesting.CheckOneConsumerSpan
	newBookingParty      = inboxtesting.NewBookingParty
)
