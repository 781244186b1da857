// Command reconcile prints the reconciliation report of the platform (see
// package reconcile and docs/reconciliation.md), or with -serve keeps
// reconciling and serves the gauges the reconciliation alerts use.
//
//	reconcile                      one report, as a table (make reconcile)
//	reconcile -o json              the same for scripts
//	reconcile -serve 127.0.0.1:9085 -interval 1m
//
// Run `reconcile -h` for the thresholds.
package main

import (
	"context"
	"errors"
	"flag"
	"io"

	"github.com/onceflow/onceflow/platform/lifecycle"
	"github.com/onceflow/onceflow/tools/reconcile"
)

func main() { lifecycle.Main("reconcile", run) }

// run is reconcile.Command as a lifecycle.RunFunc: -h, which asked for the
// usage, is a success here.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	err := reconcile.Command(ctx, "reconcile", args[1:], getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}
