// Package billing is the middle service of the platform: it consumes order
// events through the inbox, records one charge per order in the same
// transaction as the inbox row, and emits PaymentCaptured and
// PaymentRefunded through its own outbox to billing.events.
package billing
