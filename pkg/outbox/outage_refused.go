package outbox

import "time"

// refused is the polling relay's memory of the events Kafka refused because
// of the broker, by topic and aggregate (so by partition: an aggregate's
// key always hashes to the same one), until a later write of the same
// aggregate is taken. Kafka works again only once it is empty: on a
// cluster, a broker that dies (or that the relay cannot reach) takes only
// its partitions down, and the relay, which defers the refused rows and
// goes on with the rest, would otherwise announce the recovery on the first
// batch the other partitions took, while the refused events still wait.
//
// An aggregate whose rows this relay no longer writes (its partition moved
// to another relay, its row requeued elsewhere) would never be taken here
// again; it is forgotten once it has not been refused for forget, longer
// than the longest deferral (OutageBackoffMax), so that a row still
// deferred is always retried before its aggregate is forgotten.
type refused struct {
	forget time.Duration
	m      map[refusedKey]time.Time // when last refused
}

type refusedKey struct{ topic, aggregate string }

func newRefused(forget time.Duration) *refused {
	return &refused{forget: forget, m: map[refusedKey]time.Time{}}
}

func (s *refused) refuse(topic, aggregate string, now time.Time) {
	s.m[refusedKey{topic, aggregate}] = now
}

func (s *refused) take(topic, aggregate string) {
	delete(s.m, refusedKey{topic, aggregate})
}

// waiting reports whether a refused aggregate still waits to be taken,
// forgetting those not refused for forget.
func (s *refused) waiting(now time.Time) bool {
	for k, at := range s.m {
		if now.Sub(at) > s.forget {
			delete(s.m, k)
		}
	}
	return len(s.m) > 0
}
