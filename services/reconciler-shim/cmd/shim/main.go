// Command shim runs the reconciler shim: the inbox consumer of billing.events
// that forwards each payment once to the third-party reconciler.
// Configuration is read from the environment; see Config in run.go.
package main

import (
	"context"
	"os"

	"github.com/onceflow/onceflow/pkg/platform/lifecycle"
)

func main() {
	lifecycle.Main("shim", func(ctx context.Context) error {
		return run(ctx, os.Args, os.Getenv, os.Stdout)
	})
}
