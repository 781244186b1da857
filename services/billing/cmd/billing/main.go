// Command billing runs the billing service: the inbox consumer of
// orders.events, the outbox relay to billing.events, and a small read API.
// Configuration is read from the environment; see Config in run.go.
package main

import "github.com/onceflow/onceflow/platform/lifecycle"

func main() { lifecycle.Main("billing", run) }
