// Package shim protects a third-party reconciler that is not idempotent and
// cannot be changed. It consumes payment events through the inbox and
// forwards each payment to the third party once.
//
// The call to the third party cannot join the database transaction, so the
// shim uses the inbox's lease mode (inbox.Effect): the message is leased to
// one worker with a fencing token, the call carries the event id as its
// Idempotency-Key, and the row is marked done afterwards. A delivery whose
// predecessor may have called out (a crash, a timeout) first asks the third
// party whether it already has that key, and records the forward without
// calling again when it does.
//
// The stand-in third party lives in package thirdparty and cmd/reconciler.
package shim
