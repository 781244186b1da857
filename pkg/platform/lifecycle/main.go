package lifecycle

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// RunFunc is a program's main without the process: args is the whole
// command line, the program's name first (os.Args), getenv reads its
// environment and stdout is where it writes. Tests call it with their own.
type RunFunc func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error

// Main is the whole of a program's main function, shared by the services'
// and tools' commands so that each one stops and reports the same way: it
// calls run with os.Args, os.Getenv, os.Stdout and a context that ends on
// SIGINT or SIGTERM (so run can drain instead of being killed mid-write),
// and exits with the status ExitCode gives run's error. name prefixes the
// error on stderr.
func Main(name string, run RunFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args, os.Getenv, os.Stdout)
	stop()
	os.Exit(ExitCode(name, err, os.Stderr))
}

// ExitCode turns the error a program's run returned into its exit status:
// 0 for nil; 2 for flag.ErrHelp, without a message, because the usage has
// already been printed and 2 is what the flag package exits with for a
// usage error; 1 for any other error, written to stderr as "name: error".
func ExitCode(name string, err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}
