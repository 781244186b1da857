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

// ErrUsage marks a command line the program cannot run: a missing command,
// an argument where none is taken. Wrap it with what was wrong; the program
// exits 2, as the flag package does for a flag it does not know.
var ErrUsage = errors.New("usage")

// ExitCode turns the error a program's run returned into its exit status:
// 0 for nil and for flag.ErrHelp (-h asked for the usage, which is printed:
// that is a success, and scripts may run `prog -h`); 2 for ErrUsage, with
// the error on stderr; 1 for any other error, written to stderr as
// "name: error".
func ExitCode(name string, err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}
