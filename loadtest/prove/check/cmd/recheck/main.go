// Command recheck checks a saved nemesis history again and prints its table
// and the stories of its findings; it exits 1 when the history broke an
// invariant.
//
//	go run ./loadtest/prove/check/cmd/recheck [-stories N] .prove/runs/<run>/nemesis/history.jsonl …
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/onceflow/onceflow/loadtest/prove/check"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "recheck:", err)
		os.Exit(1)
	}
}

func run(_ context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	max := fs.Int("stories", 5, "the most findings of each kind whose story is printed (0: all)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("name one or more history files (history.jsonl beside a nemesis run's logs)")
	}
	var results []check.Result
	for _, path := range fs.Args() {
		h, err := check.ReadFile(path)
		if err != nil {
			return err
		}
		results = append(results, check.Check(h))
	}
	check.Table(stdout, results)
	failed := 0
	for _, r := range results {
		if !r.OK() {
			failed++
			fmt.Fprintln(stdout)
			check.Stories(stdout, r, *max)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d histories broke an invariant", failed, len(results))
	}
	return nil
}
