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
//	contractcheck [-brokers 127.0.0.1:59092] [-asyncapi docs/asyncapi.yaml] [-show 5] [topic=channel ...]
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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"

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
	brokers := fs.String("brokers", envOr("KAFKA_BROKERS", "127.0.0.1:59092"), "Kafka bootstrap brokers, comma-separated")
	docPath := fs.String("asyncapi", "docs/asyncapi.yaml", "the AsyncAPI document")
	show := fs.Int("show", 5, "how many invalid records of each topic to print")
	if err := fs.Parse(args); err != nil {
		return err
	}
	doc, err := contracts.LoadAsyncAPI(*docPath)
	if err != nil {
		return err
	}
	type target struct{ topic, channel string }
	var targets []target
	if fs.NArg() == 0 {
		for id, ch := range doc.Channels {
			targets = append(targets, target{ch.Address, id})
		}
	}
	for _, a := range fs.Args() {
		topic, channel, ok := strings.Cut(a, "=")
		if !ok || doc.Channels[channel] == nil {
			return fmt.Errorf("argument %q: want topic=channel, a channel of %s", a, *docPath)
		}
		targets = append(targets, target{topic, channel})
	}
	slices.SortFunc(targets, func(a, b target) int { return strings.Compare(a.topic, b.topic) })

	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	broker := strings.Split(*brokers, ",")[0]
	var bad, events int
	for _, tg := range targets {
		ch := doc.Channels[tg.channel]
		parts, err := partitions(ctx, broker, tg.topic)
		if err != nil {
			return err
		}
		if len(parts) == 0 {
			fmt.Fprintf(stdout, "%-24s no such topic: skipped\n", tg.topic)
			continue
		}
		counts := map[string]int{}
		var shown int
		for _, p := range parts {
			err := readPartition(ctx, broker, tg.topic, p, func(m kafka.Message) {
				id, err := ch.Check(m, len(parts))
				if err != nil {
					bad++
					counts["INVALID"]++
					if shown < *show {
						shown++
						fmt.Fprintf(stdout, "  %v\n", err)
					}
					return
				}
				counts[id]++
				if !strings.HasSuffix(tg.channel, "DeadLetters") {
					events++
				}
			})
			if err != nil {
				return err
			}
		}
		fmt.Fprintf(stdout, "%-24s %-26s %v\n", tg.topic, "("+tg.channel+")", counts)
	}
	switch {
	case bad > 0:
		return fmt.Errorf("%d records are off the contract of %s", bad, *docPath)
	case events == 0:
		return errors.New("no event record found: run `make demo` first (or name the topics: topic=channel)")
	}
	fmt.Fprintf(stdout, "every record is valid against %s and reads as a CloudEvent (%d events)\n", *docPath, events)
	return nil
}

// partitions returns topic's partition ids, none when it does not exist.
func partitions(ctx context.Context, broker, topic string) ([]int, error) {
	conn, err := kafka.DialContext(ctx, "tcp", broker)
	if err != nil {
		return nil, fmt.Errorf("reaching Kafka at %s (make up): %w", broker, err)
	}
	defer conn.Close()
	ps, err := conn.ReadPartitions(topic)
	if errors.Is(err, kafka.UnknownTopicOrPartition) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the partitions of %s: %w", topic, err)
	}
	var out []int
	for _, p := range ps {
		if p.Topic == topic {
			out = append(out, p.ID)
		}
	}
	slices.Sort(out)
	return out, nil
}

// readPartition hands each record of the partition, first to last as of
// now, to f.
func readPartition(ctx context.Context, broker, topic string, partition int, f func(kafka.Message)) error {
	conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, partition)
	if err != nil {
		return fmt.Errorf("reaching the leader of %s/%d: %w", topic, partition, err)
	}
	first, last, err := conn.ReadOffsets()
	conn.Close()
	if err != nil {
		return fmt.Errorf("reading the offsets of %s/%d: %w", topic, partition, err)
	}
	if first >= last {
		return nil
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, Partition: partition,
		MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(first); err != nil {
		return err
	}
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			return fmt.Errorf("reading %s/%d at %d of %d: %w", topic, partition, m.Offset, last, err)
		}
		f(m)
		if m.Offset >= last-1 {
			return nil
		}
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
