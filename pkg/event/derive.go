package event

import (
	"crypto/sha256"

	"github.com/google/uuid"
)

// DerivedID returns the id of what cause leads to, named by name: the same
// cause and name give the same id, however often the work is redone. A
// consumer that makes ids from the event it handles (a payment id, the
// event it emits, an idempotency key a third party sees) then keeps them
// across a redo: a redelivery after its inbox row was lost (a Postgres
// failover that took back the last commits), a replay. A fresh NewID there
// would make the redo a second, different charge that nothing downstream
// can recognise.
//
// The result has NewID's layout: cause's first 48 bits (a UUIDv7's
// millisecond timestamp, so ids derived from later events sort later), the
// version 7 and variant bits, and the rest from SHA-256 of cause and name.
func DerivedID(cause uuid.UUID, name string) uuid.UUID {
	h := sha256.New()
	h.Write(cause[:])
	h.Write([]byte(name))
	sum := h.Sum(nil)
	var id uuid.UUID
	copy(id[:6], cause[:6])
	copy(id[6:], sum[:10])
	id[6] = 0x70 | id[6]&0x0f // version 7
	id[8] = 0x80 | id[8]&0x3f // RFC 9562 variant
	return id
}
