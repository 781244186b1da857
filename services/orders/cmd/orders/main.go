// Command orders runs the orders service: the HTTP API and the outbox relay
// that publishes its events to Kafka. Configuration is read from the
// environment; see Config in run.go.
package main

import "github.com/onceflow/onceflow/platform/lifecycle"

func main() { lifecycle.Main("orders", run) }
