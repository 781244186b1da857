package inbox_test

import (
	"testing"

	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
)

// fixture is inboxtesting's, with the methods only these tests add.
type fixture struct{ *inboxtesting.Fixture }

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return &fixture{inboxtesting.NewFixture(t)}
}
