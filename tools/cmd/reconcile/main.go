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
	"os"

	"github.com/onceflow/onceflow/pkg/platform/lifecycle"
	"github.com/onceflow/onceflow/tools/reconcile"
)

func main() {
	lifecycle.Main("reconcile", func(ctx context.Context) error {
		err := reconcile.Command(ctx, "reconcile", os.Args[1:], os.Getenv, os.Stdout)
		if errors.Is(err, flag.ErrHelp) {
			return nil // -h asked for the usage: that is a success here
		}
		return err
	})
}
