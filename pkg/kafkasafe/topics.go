package kafkasafe

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/segmentio/kafka-go"
)

// DeadLetterSuffix names a topic's dead-letter topic: the inbox dead-letters
// a message of topic T to T + DeadLetterSuffix unless its
// Config.DeadLetterTopic says otherwise.
const DeadLetterSuffix = ".dlt"

// Replication is how many copies of a topic's partitions the cluster keeps
// (Factor) and how many of them must have a write before a producer that
// asks for acks=all (every writer NewWriter builds) is told it succeeded
// (MinISR, the topic's min.insync.replicas).
//
// The pair decides what a broker's death costs. With Factor 1 a dead
// broker's partitions are gone until it returns; with MinISR 1 and any
// Factor, acks=all is satisfied by the leader alone, and a leader that dies
// right after acknowledging takes the write with it. Production runs
// Factor 3, MinISR 2: one broker can die at any time without losing an
// acknowledged write or stopping the writes.
type Replication struct {
	Factor int
	MinISR int
}

// ReplicationFor is the default for a cluster of brokers brokers: a factor
// of min(3, brokers) and a min ISR of min(2, factor). It stays correct on a
// single broker (1 and 1, the only possible values) and is the production
// shape from three brokers on.
func ReplicationFor(brokers int) Replication {
	f := min(3, max(brokers, 1))
	return Replication{Factor: f, MinISR: min(2, f)}
}

// Validate reports a pair the cluster could not honour: a factor above its
// broker count, or a min ISR above the factor, which would refuse every
// acks=all write.
func (r Replication) Validate(brokers int) error {
	switch {
	case r.Factor < 1:
		return fmt.Errorf("replication factor must be at least 1, got %d", r.Factor)
	case brokers > 0 && r.Factor > brokers:
		return fmt.Errorf("replication factor %d needs %d brokers, the cluster has %d", r.Factor, r.Factor, brokers)
	case r.MinISR < 1 || r.MinISR > r.Factor:
		return fmt.Errorf("min.insync.replicas must be 1 to the replication factor %d, got %d", r.Factor, r.MinISR)
	}
	return nil
}

// TopicSpec is how EnsureTopics creates a topic that does not exist.
type TopicSpec struct {
	// Partitions of each topic; required. Choose it once: adding partitions
	// later moves keys to other partitions and breaks per-key order.
	Partitions int
	// Replication: zero means ReplicationFor(the cluster's size).
	Replication Replication
	// DeadLetters also ensures each topic's dead-letter topic (topic +
	// DeadLetterSuffix), with the same spec: a consumer refuses to start
	// while its dead-letter topic is missing.
	DeadLetters bool
	// Configs are further topic settings (min.insync.replicas is set from
	// Replication).
	Configs []kafka.ConfigEntry
}

// TopicState is what EnsureTopics found or did for one topic.
type TopicState struct {
	Name        string
	Created     bool
	Partitions  int
	Replication Replication // for an existing topic, MinISR is 0 (not read)
}

// EnsureTopics creates those of topics (and, with spec.DeadLetters, their
// dead-letter topics) that do not exist, with spec's partitions and
// replication (by default ReplicationFor the cluster's size), asking
// through client (its Addr the bootstrap brokers; its Transport TLS and
// SASL), and reports each. Existing topics are left alone even when they
// differ: repartitioning breaks per-key order and raising a replication
// factor moves data, decisions for a person, not for a setup step; the
// caller reports the difference. It does not wait for the new partitions'
// leaders.
func EnsureTopics(ctx context.Context, client *kafka.Client, spec TopicSpec, topics ...string) ([]TopicState, error) {
	if spec.Partitions < 1 {
		return nil, fmt.Errorf("partitions must be at least 1, got %d", spec.Partitions)
	}
	if spec.DeadLetters {
		all := slices.Clone(topics)
		for _, t := range topics {
			all = append(all, t+DeadLetterSuffix)
		}
		topics = all
	}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return nil, fmt.Errorf("reading the cluster's metadata from %v: %w", client.Addr, err)
	}
	repl := spec.Replication
	if repl == (Replication{}) {
		repl = ReplicationFor(ClusterSize(md))
	}
	if err := repl.Validate(len(md.Brokers)); err != nil {
		return nil, fmt.Errorf("creating topics %v: %w", topics, err)
	}
	existing := map[string]kafka.Topic{}
	for _, t := range md.Topics {
		existing[t.Name] = t
	}
	states := make([]TopicState, 0, len(topics))
	var create []kafka.TopicConfig
	for _, name := range topics {
		if t, ok := existing[name]; ok && t.Error == nil {
			st := TopicState{Name: name, Partitions: len(t.Partitions)}
			if len(t.Partitions) > 0 {
				st.Replication.Factor = len(t.Partitions[0].Replicas)
			}
			states = append(states, st)
			continue
		}
		configs := append(slices.Clone(spec.Configs),
			kafka.ConfigEntry{ConfigName: "min.insync.replicas", ConfigValue: strconv.Itoa(repl.MinISR)})
		create = append(create, kafka.TopicConfig{Topic: name, NumPartitions: spec.Partitions,
			ReplicationFactor: repl.Factor, ConfigEntries: configs})
		states = append(states, TopicState{Name: name, Created: true, Partitions: spec.Partitions, Replication: repl})
	}
	if len(create) == 0 {
		return states, nil
	}
	// The client sends CreateTopics to the controller, whichever broker that is.
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: create})
	if err != nil {
		return nil, fmt.Errorf("creating topics: %w", err)
	}
	var errs []error
	for name, err := range resp.Errors {
		// Another creator won the race: the topic exists, which is all we want.
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			errs = append(errs, fmt.Errorf("creating topic %s: %w", name, err))
		}
	}
	return states, errors.Join(errs...)
}

// ClusterSize counts every broker a metadata response knows of: the live
// ones and those that hold a replica of a topic but are down now (a broker
// that is down and holds nothing is not known to a client). A replication
// default taken from the live brokers alone would shrink while one is down.
func ClusterSize(md *kafka.MetadataResponse) int {
	ids := map[int]bool{}
	for _, b := range md.Brokers {
		ids[b.ID] = true
	}
	for _, t := range md.Topics {
		for _, p := range t.Partitions {
			for _, r := range p.Replicas {
				ids[r.ID] = true
			}
		}
	}
	return len(ids)
}

// MissingTopics returns those of topics the cluster does not have, asking
// through client with a metadata request that does not create them (a
// broker with auto.create.topics.enable would create a topic a plain
// request names). An error means the cluster did not answer: nothing is
// known then.
func MissingTopics(ctx context.Context, client *kafka.Client, topics ...string) ([]string, error) {
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return nil, fmt.Errorf("reading the cluster's metadata from %v: %w", client.Addr, err)
	}
	have := map[string]bool{}
	for _, t := range md.Topics {
		if t.Error == nil {
			have[t.Name] = true
		}
	}
	var missing []string
	for _, t := range topics {
		if !have[t] {
			missing = append(missing, t)
		}
	}
	return missing, nil
}
