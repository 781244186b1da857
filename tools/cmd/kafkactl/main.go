// Command kafkactl is the dev stack's small Kafka helper: it tells whether the
// broker answers, creates the platform's topics, and lists what exists.
//
// devstack/stack.sh uses it instead of Kafka's own shell tools because those
// start a JVM per call (seconds each) while this answers in milliseconds, and
// because it speaks to the broker through segmentio/kafka-go, the same client
// the services use: if kafkactl can talk to the broker, so can they.
//
// Usage:
//
//	kafkactl wait          -brokers 127.0.0.1:7092 -timeout 60s [-expect-brokers 3]
//	kafkactl ensure-topics -brokers 127.0.0.1:7092 -partitions 6 [-replication-factor 3 -min-insync-replicas 2] orders.events billing.events
//	kafkactl topics        -brokers 127.0.0.1:7092
//	kafkactl tail          -brokers 127.0.0.1:7092 -n 10 orders.events
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/lifecycle"
)

func main() { lifecycle.Main("kafkactl", run) }

const usage = `usage:
  kafkactl wait          [-brokers host:port,...] [-timeout 60s] [-expect-brokers N]
                         until the metadata lists a controller and at least N brokers (default 1)
  kafkactl ensure-topics [-brokers host:port,...] [-partitions 6] [-replication-factor N] [-min-insync-replicas N] [-timeout 30s] topic...
                         creates the missing topics; replication factor and min.insync.replicas
                         default to min(3, brokers) and min(2, factor)
  kafkactl topics        [-brokers host:port,...]
  kafkactl tail          [-brokers host:port,...] [-n 10] [-key K] [-since 10m] [-values] [-o text|json] topic
                         the last records of a topic (all partitions, oldest first) with their headers`

// defaultBrokers matches the dev stack's default ONCEFLOW_KAFKA_PORT.
const defaultBrokers = "127.0.0.1:7092"

// run is main without the process (lifecycle.RunFunc). The broker comes from
// the -brokers flag only, so getenv goes unused.
func run(ctx context.Context, args []string, _ func(string) string, stdout io.Writer) error {
	args = args[1:] // the program's name
	if len(args) == 0 {
		fmt.Fprintln(stdout, usage)
		return fmt.Errorf("%w: no command given", lifecycle.ErrUsage)
	}
	cmd, args := args[0], args[1:]

	fs := flag.NewFlagSet("kafkactl "+cmd, flag.ContinueOnError)
	// -h is asked for, so its answer goes where the asker reads.
	fs.SetOutput(stdout)
	brokers := fs.String("brokers", defaultBrokers, "comma-separated bootstrap brokers")
	switch cmd {
	case "wait":
		timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
		expect := fs.Int("expect-brokers", 1, "wait until the metadata lists at least this many brokers (a cluster's every node)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		return waitReady(ctx, splitBrokers(*brokers), *timeout, *expect, stdout)
	case "ensure-topics":
		partitions := fs.Int("partitions", 6, "partition count for topics that are created")
		rf := fs.Int("replication-factor", 0, "replication factor for topics that are created (0: min(3, brokers))")
		minISR := fs.Int("min-insync-replicas", 0, "min.insync.replicas for topics that are created (0: min(2, replication factor))")
		timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			return errors.New("ensure-topics: name at least one topic")
		}
		if *partitions < 1 {
			return fmt.Errorf("ensure-topics: -partitions must be at least 1, got %d", *partitions)
		}
		if *rf < 0 || *minISR < 0 || (*rf == 0 && *minISR != 0) {
			return errors.New("ensure-topics: -min-insync-replicas needs -replication-factor, and neither may be negative")
		}
		repl := kafkautil.Replication{Factor: *rf, MinISR: *minISR}
		if *rf > 0 && *minISR == 0 {
			repl.MinISR = kafkautil.ReplicationFor(*rf).MinISR
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		return ensureTopics(ctx, splitBrokers(*brokers), fs.Args(), kafkautil.TopicSpec{Partitions: *partitions, Replication: repl}, stdout)
	case "topics":
		if err := fs.Parse(args); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return listTopics(ctx, splitBrokers(*brokers), stdout)
	case "tail":
		n := fs.Int("n", 10, "show the last n records of the topic (the last n of each partition are read, then merged by time)")
		key := fs.String("key", "", "only records with this key (an order id)")
		since := fs.Duration("since", 0, "read from this long ago instead of the last -n of each partition, e.g. 10m")
		values := fs.Bool("values", false, "print whole values (default: the first 200 bytes)")
		output := fs.String("o", "text", "output: text or json (one object a line)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return errors.New("tail: name one topic\n" + usage)
		}
		if *output != "text" && *output != "json" {
			return fmt.Errorf("tail: -o must be text or json, got %q", *output)
		}
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return tail(ctx, splitBrokers(*brokers), fs.Arg(0), tailOptions{n: *n, key: *key, since: *since, values: *values, json: *output == "json"}, stdout)
	case "help", "-h", "-help", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	default:
		return fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}
}

func splitBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// dial connects to the first broker that answers. Every operation gets a fresh
// connection because a broker that is still starting may accept and then drop
// connections; retrying on a new one is what a real client would do too.
func dial(ctx context.Context, brokers []string) (*kafka.Conn, error) {
	if len(brokers) == 0 {
		return nil, errors.New("no brokers given")
	}
	dialer := &kafka.Dialer{Timeout: 5 * time.Second}
	var errs []error
	for _, addr := range brokers {
		conn, err := dialer.DialContext(ctx, "tcp", addr)
		if err == nil {
			// kafka-go's request methods take no context: bound them with a deadline.
			deadline, ok := ctx.Deadline()
			if !ok || time.Until(deadline) > 10*time.Second {
				deadline = time.Now().Add(10 * time.Second)
			}
			if err := conn.SetDeadline(deadline); err != nil {
				conn.Close()
				return nil, fmt.Errorf("setting deadline on %s: %w", addr, err)
			}
			return conn, nil
		}
		errs = append(errs, fmt.Errorf("dialing %s: %w", addr, err))
	}
	return nil, errors.Join(errs...)
}

// waitReady retries a metadata request until the cluster reports expect
// brokers and a controller. Only then can topics be created with the
// cluster's replication factor, so that is what "ready" means.
func waitReady(ctx context.Context, brokers []string, timeout time.Duration, expect int, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var lastErr error
	for {
		lastErr = probe(ctx, brokers, expect)
		if lastErr == nil {
			fmt.Fprintf(stdout, "kafka at %s is ready\n", strings.Join(brokers, ","))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafka at %s not ready after %s: %w", strings.Join(brokers, ","), timeout, lastErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func probe(ctx context.Context, brokers []string, expect int) error {
	conn, err := dial(ctx, brokers)
	if err != nil {
		return err
	}
	defer conn.Close()

	bs, err := conn.Brokers()
	if err != nil {
		return fmt.Errorf("reading brokers: %w", err)
	}
	if len(bs) == 0 {
		return errors.New("metadata lists no brokers yet")
	}
	if len(bs) < expect {
		return fmt.Errorf("metadata lists %d of %d brokers yet", len(bs), expect)
	}
	controller, err := conn.Controller()
	if err != nil {
		return fmt.Errorf("reading controller: %w", err)
	}
	if controller.Host == "" {
		return errors.New("metadata names no controller yet")
	}
	return nil
}

// ensureTopics creates the topics that do not exist yet (kafkautil.EnsureTopics:
// spec's partitions and replication, by default the cluster's) and waits until
// every partition of every named topic has a leader that serves it
// (kafkautil.WaitTopicsReady), so a consumer or producer started right after
// does not race the broker. Existing topics are left alone, even with another
// partition count or replication factor, and the difference is reported:
// repartitioning would break per-key ordering and raising the factor moves
// data, decisions for a person, not for a setup script.
func ensureTopics(ctx context.Context, brokers, topics []string, spec kafkautil.TopicSpec, stdout io.Writer) error {
	states, err := kafkautil.EnsureTopics(ctx, kafkautil.Security{}, brokers, spec, topics...)
	if err != nil {
		return err
	}
	for _, st := range states {
		switch {
		case st.Created:
			fmt.Fprintf(stdout, "created topic %s (%d partitions, replication factor %d, min.insync.replicas %d)\n",
				st.Name, st.Partitions, st.Replication.Factor, st.Replication.MinISR)
		case st.Partitions != spec.Partitions:
			fmt.Fprintf(stdout, "topic %s exists with %d partitions (not %d); left as it is\n", st.Name, st.Partitions, spec.Partitions)
		}
		if !st.Created && spec.Replication.Factor > 0 && st.Replication.Factor != spec.Replication.Factor {
			fmt.Fprintf(stdout, "topic %s exists with replication factor %d (not %d); left as it is\n",
				st.Name, st.Replication.Factor, spec.Replication.Factor)
		}
	}
	// Every named topic, existing or new, must be served before this returns:
	// `make up` starts consumers right after, and a broker that has just
	// restarted re-elects the leaders of existing topics too.
	return kafkautil.WaitTopicsReady(ctx, brokers, topics...)
}

func listTopics(ctx context.Context, brokers []string, stdout io.Writer) error {
	conn, err := dial(ctx, brokers)
	if err != nil {
		return err
	}
	defer conn.Close()
	ps, err := conn.ReadPartitions()
	if err != nil {
		return fmt.Errorf("reading topics: %w", err)
	}
	// Per topic: partitions, and the fewest replicas and in-sync replicas
	// of any of them (what a broker's death costs that topic).
	type row struct{ partitions, replicas, isr int }
	rows := map[string]*row{}
	for _, p := range ps {
		r := rows[p.Topic]
		if r == nil {
			r = &row{replicas: len(p.Replicas), isr: len(p.Isr)}
			rows[p.Topic] = r
		}
		r.partitions++
		r.replicas, r.isr = min(r.replicas, len(p.Replicas)), min(r.isr, len(p.Isr))
	}
	names := make([]string, 0, len(rows))
	for t := range rows {
		names = append(names, t)
	}
	slices.Sort(names)
	fmt.Fprintf(stdout, "%-40s %-10s %-8s %s\n", "TOPIC", "PARTITIONS", "REPLICAS", "IN-SYNC (fewest)")
	for _, t := range names {
		r := rows[t]
		fmt.Fprintf(stdout, "%-40s %-10d %-8d %d\n", t, r.partitions, r.replicas, r.isr)
	}
	return nil
}
