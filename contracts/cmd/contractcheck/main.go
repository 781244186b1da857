// Command contractcheck validates the records already in Kafka against
// docs/asyncapi.yaml: every record of every topic the document names
// (orders.events, billing.events and their dead-letter topics), from the
// first offset to the last, by the checks the contract tests run (headers
// and payload against the schemas, the key and the CloudEvents headers
// equal to the envelope's, the partition murmur2 of the key, the record
// read as a valid event by the CloudEvents SDK). `make contracts-check`
// runs it after `make demo`.
//
// Usage:
//
//	contractcheck [-brokers 127.0.0.1:7092] [-asyncapi docs/asyncapi.yaml] [-show 5] [topic=channel ...]
//
// With no argument it checks each channel of the document on the topic of
// its address; topic=channel checks a topic of another name (ORDERS_TOPIC
// set otherwise) as that channel. It exits 1 when a record is off the
// contract, or when no event was found at all (nothing to vouch for).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/onceflow/onceflow/contracts"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "contractcheck:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("contractcheck", flag.ContinueOnError)
	brokers := fs.String("brokers", envOr("KAFKA_BROKERS", "127.0.0.1:7092"), "Kafka bootstrap brokers, comma-separated")
	docPath := fs.String("asyncapi", "docs/asyncapi.yaml", "the AsyncAPI document")
	show := fs.Int("show", 5, "how many invalid records of each topic to print")
	if err := fs.Parse(args); err != nil {
		return err
	}
	doc, err := contracts.LoadAsyncAPI(*docPath)
	if err != nil {
		return err
	}
	var targets []contracts.Target
	if fs.NArg() == 0 {
		targets = doc.Targets()
	}
	for _, a := range fs.Args() {
		topic, channel, ok := strings.Cut(a, "=")
		if !ok || doc.Channels[channel] == nil {
			return fmt.Errorf("argument %q: want topic=channel, a channel of %s", a, *docPath)
		}
		targets = append(targets, contracts.Target{Topic: topic, Channel: channel})
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	tally, err := doc.CheckTopics(ctx, strings.Split(*brokers, ",")[0], targets, *show, stdout)
	switch {
	case err != nil:
		return err
	case tally.Invalid > 0:
		return fmt.Errorf("%d records are off the contract of %s", tally.Invalid, *docPath)
	case tally.Events == 0:
		return errors.New("no event record found: run `make demo` first (or name the topics: topic=channel)")
	}
	fmt.Fprintf(stdout, "every record is valid against %s and reads as a CloudEvent (%d events)\n", *docPath, tally.Events)
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
