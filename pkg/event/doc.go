// Package event defines the envelope every onceflow event travels in, and how
// it is carried on a Kafka message.
//
// The envelope is shared by the producing side (package outbox) and the
// consuming side (package inbox); it lives here so that neither library
// depends on the other.
//
// On the wire the Kafka key is the aggregate id (so one aggregate's events
// share a partition and stay in order), the value is the payload JSON, and
// every envelope field travels as a Kafka header (see the Header constants).
// Beside them travel the CloudEvents Kafka binding's binary-mode headers
// (ce_specversion, ce_id, ce_source, ce_type, ce_subject, ce_time: see
// AppendCloudEvents), so that any CloudEvents consumer reads a record as an
// event; docs/asyncapi.yaml is the contract.
// Payloads are integration contracts, never serialized database rows.
package event
