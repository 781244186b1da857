// Package reconcile finds what the outbox and the inbox leave to reconcile
// across the platform's three databases and the third party's ledger (see
// docs/reconciliation.md, after "Reconciliation Is Part of the Pattern"):
// outbox rows stuck pending or dead, inbox messages stuck in an expired
// lease, uncertain forwards waiting for a human, dead letters past their
// SLA, orders with no charge and charges with no settlement after a while.
//
// Run reads with a read-only role (reconcile_ro, see package pgroles) and
// returns a Report: per kind of finding a count, the oldest age, a few
// sample ids and the runbook line saying what to do. Metrics publishes a
// report as the gauges the alerts in dashboards/alerts use. It lives in
// tools/ because it reads several services' databases, which no service
// may do.
package reconcile
