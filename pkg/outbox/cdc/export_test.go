package cdc

import "context"

// RetainOnce runs one round of the log-based relay's retention (the horizon
// moved, then the published rows older than Retain deleted), as its
// goroutine does every RetentionInterval: the interleaving tests take it as
// a step of its own.
func (r *Relay) RetainOnce(ctx context.Context) error { return r.deleteConfirmed(ctx) }

// MsgWaitingForCommit is what the relay logs when a row it must mark dead
// is not visible yet a while after its commit was decoded.
const MsgWaitingForCommit = msgWaitingForCommit
