// Package journey follows one order through the whole platform: its row in
// orders, the events its outbox wrote, the Kafka records (partition, offset,
// headers, and the relay mode that published them), what billing's and the
// shim's inboxes did with them, the charge, the forward, the dead-letter
// topics and the third party's ledger, each with its time and the latency
// of the hop that led to it, and what is missing or odd.
//
// It only reads: the databases through a read-only role (reconcile_ro), the
// outbox's and the inbox's tables through outboxadmin.EventsOf and
// inboxadmin.MessagesOf (this package knows neither table), Kafka by offset, the
// ledger by idempotency key. onceflowctl journey is its command line.
package journey
