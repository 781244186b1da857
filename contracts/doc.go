// Package contracts keeps the platform's published contracts true to the
// code: docs/asyncapi.yaml (the events on Kafka, CloudEvents headers
// included) and docs/openapi-*.yaml (orders' public API and every
// program's operator endpoints).
//
// It is its own module, outside pkg/ and outside every service, so that the
// schema validator and the CloudEvents SDK it uses never reach a production
// binary. Its tests compare the documents with the Go types, headers and
// routes, and validate the records and responses of the real services
// against them; cmd/contractcheck validates the records already in Kafka
// (those `make demo` left) the same way. docs/contracts.md is the guide for
// a consumer team.
package contracts
