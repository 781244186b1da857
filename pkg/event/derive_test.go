package event_test

import (
	"testing"

	"github.com/onceflow/onceflow/pkg/event"
)

// Issue 32: an id derived from its cause is the same on every redo, differs
// by name and by cause, and keeps NewID's layout and order.
func TestDerivedIDIsStableAndSortsWithItsCause(t *testing.T) {
	a, b := event.NewID(), event.NewID()
	if event.DerivedID(a, "payment") != event.DerivedID(a, "payment") {
		t.Fatal("the same cause and name gave two ids")
	}
	if event.DerivedID(a, "payment") == event.DerivedID(a, "PaymentCaptured") {
		t.Fatal("two names gave one id")
	}
	if event.DerivedID(a, "payment") == event.DerivedID(b, "payment") {
		t.Fatal("two causes gave one id")
	}
	id := event.DerivedID(a, "payment")
	if id.Version() != 7 || id.Variant().String() != "RFC4122" {
		t.Fatalf("derived id %s: version %d, variant %s; want 7, RFC4122", id, id.Version(), id.Variant())
	}
	if !(event.DerivedID(a, "x").String()[:13] < event.DerivedID(b, "x").String()[:13] || a.String()[:13] == b.String()[:13]) {
		t.Fatalf("ids derived from %s and the later %s do not sort in their order", a, b)
	}
}
