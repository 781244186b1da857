// Command demo drives the running platform end to end: it places orders
// through the orders API (cancelling some), waits while showing progress
// until every payment has reached the third-party reconciler, then audits the
// result and prints a summary. It exits non-zero when an order was not
// settled exactly once.
//
// `make demo` starts the platform and runs it; it talks only HTTP, so it also
// works against `docker compose up`.
package main

import "github.com/onceflow/onceflow/platform/lifecycle"

func main() { lifecycle.Main("demo", run) }
