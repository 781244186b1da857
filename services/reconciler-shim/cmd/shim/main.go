// Command shim runs the reconciler shim: the inbox consumer of billing.events
// that forwards each payment once to the third-party reconciler.
// Configuration is read from the environment; see Config in run.go.
package main

import "github.com/onceflow/onceflow/platform/lifecycle"

func main() { lifecycle.Main("shim", run) }
