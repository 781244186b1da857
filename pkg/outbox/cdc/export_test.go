package cdc

import "context"

// RetainOnce runs one round of the log-based relay's retention (the horizon
// moved, then the published rows older than Retain deleted), as its
// goroutine does every RetentionInterval: the interleaving tests take it as
// a step of its own.
func (r *Relay) RetainOnce(ctx context.Context) error { return r.deleteConfirmed(ctx) }
