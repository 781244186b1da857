package shim

import (
	"bytes"
	"sync"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// maxSent bounds the forwards kept for record. A forward whose record never
// comes (its lease taken over after the call, the process stopping between
// the call and the mark) stays until the bound clears them all, which costs
// only a decode each later.
const maxSent = 4096

// sentPayments keeps what forward built from an event it settled, for
// record to take in the transaction that marks it done a moment later: the
// payment is decoded once per delivery, not once for the call and again for
// the record. A miss (a message settled by Check, not by a call; another
// process's call) decodes, as before.
type sentPayments struct {
	mu sync.Mutex
	m  map[uuid.UUID]sentPayment
}

type sentPayment struct {
	// The envelope's fields request reads: a record for a different
	// reading of the same event id (which the inbox would have to let
	// through first) decodes instead of trusting the call's.
	eventType string
	version   int
	payload   []byte
	req       thirdparty.SettleRequest
	p         payment
}

func (s *sentPayments) put(ev event.Envelope, req thirdparty.SettleRequest, p payment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= maxSent {
		s.m = make(map[uuid.UUID]sentPayment)
	}
	s.m[ev.EventID] = sentPayment{eventType: ev.EventType, version: ev.EventVersion, payload: ev.Payload, req: req, p: p}
}

// take returns and forgets what was put for ev, if it was put for these
// very bytes.
func (s *sentPayments) take(ev event.Envelope) (thirdparty.SettleRequest, payment, bool) {
	s.mu.Lock()
	sp, ok := s.m[ev.EventID]
	if ok {
		delete(s.m, ev.EventID)
	}
	s.mu.Unlock()
	if !ok || sp.eventType != ev.EventType || sp.version != ev.EventVersion || !bytes.Equal(sp.payload, ev.Payload) {
		return thirdparty.SettleRequest{}, payment{}, false
	}
	return sp.req, sp.p, true
}
