// Package shim protects a third-party reconciler that is not idempotent and
// cannot be changed. It consumes payment events through the inbox and
// forwards each payment to the third party once.
//
// The call to the third party cannot join the database transaction, so the
// shim closes the gap from both sides: every call carries the event id as its
// Idempotency-Key, and before calling, the shim asks the third party whether
// it already has that key. A delivery that called out and then crashed
// before its inbox row committed is therefore redelivered, finds the key,
// and records the forward without calling again.
//
// The stand-in third party lives in package thirdparty and cmd/reconciler.
package shim
