// Command reconciler runs the stand-in for the third-party reconciler: a
// deliberately non-idempotent HTTP API that books every settlement it
// receives into a JSON Lines ledger, so that a run of the platform can be
// audited for duplicate bookings. See package thirdparty for the API.
//
// Configuration is read from the environment; run `reconciler -h` to list it.
package main

import "github.com/onceflow/onceflow/platform/lifecycle"

func main() { lifecycle.Main("reconciler", run) }
