// Package shim protects a third-party reconciler that is not idempotent and
// cannot be changed. It consumes payment events through the inbox and
// forwards each payment to the third party once.
//
// The call to the third party cannot join the database transaction, so the
// shim uses the inbox's lease mode (lease.Effect): the message is leased to
// one worker with a fencing token, the call carries the event id as its
// Idempotency-Key, and the row is marked done afterwards. A delivery whose
// predecessor may have called out (a crash, a timeout) first asks the third
// party whether it already has that key, and records the forward without
// calling again when it does.
//
// The lookup and the settlement say what kind of failure they met, because
// the inbox acts on it: the third party unreachable or failing (refused,
// reset, a timeout, 5xx, 408, 429) wraps lease.ErrUnavailable, an outage
// the inbox waits out without charging the payment an attempt or
// dead-lettering it, shown in inbox_effect_connected and /readyz; a lookup
// answered with a 4xx other than the API's own not_found wraps
// lease.ErrUnknowable, and the payment is recorded uncertain for the
// reconciliation report instead of being sent again; a settlement the third
// party rejects (4xx) is dead-lettered. Each call runs under the inbox's
// lease with RECONCILER_TIMEOUT as its CallTimeout.
//
// The stand-in third party lives in package thirdparty and cmd/reconciler.
package shim
