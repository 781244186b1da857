// Command prove runs the fault-injection proofs (loadtest/prove) and prints
// their report; `make prove` runs it. It exits 1 when an outbox/inbox proof
// failed or a naive mode survived its fault (the proof did not bite).
//
//	go run ./loadtest/prove/cmd/prove [-profile full|quick] [-only atomicity,chaos] [-relay-modes poll,cdc,wal,debezium]
//	go run ./loadtest/prove/cmd/prove -only nemesis [-seed N] [-nemesis pause,thirdparty] [-nemesis-duration 3m]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/onceflow/onceflow/loadtest/prove"
	"github.com/onceflow/onceflow/platform/harness"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		// -h asked for the usage, which is printed: a success.
	case err != nil:
		fmt.Fprintln(os.Stderr, "prove:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(os.Stdout) // -h is asked for: its answer goes where the asker reads
	profile := fs.String("profile", "full", "full (make prove) or quick (the make test version)")
	only := fs.String("only", "", "comma-separated proofs to run (default all): "+names())
	relayModes := fs.String("relay-modes", "poll,cdc,wal",
		"comma-separated RELAY_MODEs the producing-side proofs ("+strings.Join(relayModeProofs(), ", ")+") run in; "+
			"debezium (Kafka Connect with docs/debezium's file as the relay) runs atomicity, relay-crash and ordering")
	dir := fs.String("dir", "", "where the harness keeps its stack, binaries, logs and reports (default <repo>/.prove)")
	seed := fs.Int64("seed", 0, "the nemesis's seed (SEED=): the same seed replays the same fault schedule; 0 picks one and prints it")
	nemesis := fs.String("nemesis", "", "the nemesis's fault kinds (NEMESIS=), e.g. pause,thirdparty or -kafka,-postgres; default all: "+strings.Join(prove.NemesisKinds, ","))
	nemesisTargets := fs.String("nemesis-targets", "", "narrow the nemesis's faults on instances (pause, kill, member) to these kinds (NEMESIS_TARGETS=): orders,billing,shim")
	nemesisDuration := fs.Duration("nemesis-duration", 0, "how long the nemesis's faults run (NEMESIS_DURATION=); default the profile's (full 10m)")
	pgReplication := fs.String("pg-replication", "", "a streaming Postgres standby for the harness's stack (PG_REPLICATION=): async or sync; "+
		"the nemesis's pgfailover fault promotes it (ONCEFLOW_PG_VERSION=17 for PostgreSQL 17 and failover slots)")
	nemesisTopology := fs.String("nemesis-topology", "", "the harness's Kafka (NEMESIS_TOPOLOGY=): empty for one broker, ha for a cluster of three "+
		"(replication factor 3, min.insync.replicas 2) and the cluster fault kinds "+strings.Join(prove.NemClusterKinds, ","))
	publishReplicated := fs.Bool("publish-replicated", false, "the services' relays publish only what the standby flushed "+
		"(PUBLISH_REPLICATED=1: OUTBOX_PUBLISH_REPLICATED; with PG_REPLICATION)")
	parallel := fs.Int("parallel", 1, "how many of the proofs that leave the shared stack alone run at once, each on its own platform")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	prof, ok := prove.Profiles[*profile]
	if !ok {
		return fmt.Errorf("no profile %q (full or quick)", *profile)
	}
	root, err := harness.RepoRoot()
	if err != nil {
		return fmt.Errorf("run from the onceflow repository: %w", err)
	}
	opts := prove.Options{Root: root, Dir: *dir, Profile: prof, Out: os.Stdout, RelayModes: strings.Split(*relayModes, ","),
		Parallel: *parallel, PublishReplicated: *publishReplicated, Nemesis: prove.NemesisOptions{Seed: *seed, Duration: *nemesisDuration, Topology: *nemesisTopology}}
	if opts.PGReplication, err = prove.ParsePGReplication(*pgReplication); err != nil {
		return err
	}
	if *nemesis != "" {
		opts.Nemesis.Kinds = strings.Split(*nemesis, ",")
	}
	if *nemesisTargets != "" {
		opts.Nemesis.Targets = strings.Split(*nemesisTargets, ",")
	}
	if *only != "" {
		opts.Only = strings.Split(*only, ",")
	}
	rep, err := prove.Run(ctx, opts)
	if err != nil {
		return err
	}
	fmt.Println()
	rep.Table(os.Stdout)
	fmt.Println()
	if !rep.OK() {
		return fmt.Errorf("%s", strings.Join(rep.Failures, "; "))
	}
	fmt.Println("every outbox/inbox proof held, and every naive mode broke under the same faults.")
	return nil
}

func names() string {
	var n []string
	for _, p := range prove.Proofs {
		n = append(n, p.Name)
	}
	return strings.Join(n, ", ")
}

func relayModeProofs() []string {
	var out []string
	for _, p := range prove.Proofs {
		if prove.RelayModeProofs[p.Name] {
			out = append(out, p.Name)
		}
	}
	return out
}
