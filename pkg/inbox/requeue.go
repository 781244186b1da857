package inbox

import (
	"context"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// ErrInvalidFilter is wrapped by the error of a RequeueDeadLetters whose
// filter selects nothing explicitly, contradicts itself, or carries a limit
// or a cursor that is not valid.
var ErrInvalidFilter = engine.ErrInvalidFilter

// MaxRequeueLimit is the most dead letters one RequeueDeadLetters call sends
// back, and the default of RequeueFilter.Limit.
const MaxRequeueLimit = engine.MaxRequeueLimit

// RequeueFilter selects the dead letters RequeueDeadLetters sends back, and
// how many per call. A dead letter matches when it matches every field that
// is set.
//
// A filter without EventIDs (All, or Consumer alone) is a sweep: it sends
// back only the dead letters that are still pending, those whose consumer
// still holds the dead_lettered inbox row of their event. Requeuing marks
// that row requeued, so a sweep sends each dead-lettering back once, a
// second sweep finds nothing left, and two sweeps at once never send the
// same one twice.
// A dead letter with no such row (a message that was not an event, or whose
// row Postgres refused) is passed over by a sweep: name its event id to send
// it back.
//
// A filter with EventIDs sends back every dead letter of those events, row
// or not: the caller said exactly what it wants, including an event that was
// requeued before.
type RequeueFilter = engine.RequeueFilter

// RequeueResult is what one RequeueDeadLetters call did.
type RequeueResult = engine.RequeueResult

// RefusedLetter is a dead letter RequeueDeadLetters did not send.
type RefusedLetter = engine.RefusedLetter

// RequeueDB is what RequeueDeadLetters needs from the caller's database
// handle: *pgxpool.Pool and *pgx.Conn satisfy it.
type RequeueDB = engine.RequeueDB

// RequeueDeadLetters sends dead letters of dltTopic that match filter back
// to their original topic, at most filter.Limit of them, oldest first within
// each partition, and returns how many it sent and where the pass goes on.
// Call it again with After set to the returned Next until Next is empty:
//
//	var next string
//	for {
//		res, err := inbox.RequeueDeadLetters(ctx, pool, w, brokers, dlt, inbox.RequeueFilter{All: true, After: next})
//		…
//		if next = res.Next; next == "" {
//			break
//		}
//	}
//
// For each dead letter it marks the dead-lettering consumer's dead_lettered
// inbox row requeued (the transition requeue of internal/state's state.go; the consumer
// applies the redelivery of a requeued row instead of taking it for a
// duplicate, and in lease mode checks first when its last call may have
// landed) and produces the original message through w: its key, value and
// headers, minus the dlt-* headers — from the original the inbox kept when
// the dead-letter topic took the letter only truncated. The marks of a chunk
// commit only after w took the chunk's messages, so a failed write leaves
// the rows, and the letters pending for the next sweep.
// Fix the cause of the failures before requeuing, or the messages come
// straight back (as new dead letters, for the next pass).
//
// Requeue is at-least-once: a commit that fails after the write leaves the
// rows, so the letters are sent again later, and the inbox absorbs the copy
// (see also RequeueFilter: a filter with EventIDs sends again what was
// requeued before). Consequences worth knowing:
//   - The requeued message reaches every consumer of the original topic, not
//     only the one that gave up; the others absorb it as a duplicate (while
//     their inbox rows are within PruneConfig.Retention).
//   - Dead letters stay in dltTopic (see ListDeadLetters); a sweep tells the
//     pending ones by their inbox rows.
//   - The message lands where w's balancer puts it: with a writer
//     hashing the key, on its original partition, if the partition count did
//     not change, but after any later events of its aggregate. Those later
//     events were parked by the consumer that dead-lettered it (Config.
//     DeadKeys), and stay parked until the requeued event is applied; then
//     they are applied in order after it. The requeued event is applied
//     even if the consumer's version guard has moved past it (a consumer
//     that skips ahead): the operator asked for it.
//
// w must not have a Topic of its own: each message names its original topic.
// db must not be a pgx.Tx: each chunk's deletes have to commit on their own,
// right after its write, or the consumers would wait on their row locks. A
// filter that Validate refuses is refused with its error. On error, Requeued
// is what was sent before the failing chunk and Next is empty: call again
// with the same After.
//
// WithDialer connects the reads of dltTopic with a TLS/SASL dialer (w
// carries its own security); the default is plain TCP.
func RequeueDeadLetters(ctx context.Context, db RequeueDB, w Writer, brokers []string, dltTopic string, filter RequeueFilter, opts ...AdminOption) (RequeueResult, error) {
	return engine.RequeueDeadLetters(ctx, db, w, brokers, dltTopic, filter, opts...)
}
