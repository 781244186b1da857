package kafkautil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// WaitTopicsReady waits until every partition of each topic has a leader
// and that leader answers a ListOffsets request for it, or ctx ends.
//
// CreateTopics returns before the partitions have leaders, and the metadata
// a broker serves can name a leader a moment before that leader takes
// requests for the partition. A consumer or producer started in that window
// gets "Not Leader For Partition" or "Unknown Topic Or Partition": a
// transient error, yet one that a rig starting services right after creating
// its topics sees on a fresh cluster. Waiting here, once, keeps that race out
// of every test that builds a platform. In a cluster every live broker must
// also know the topics (each learns them from the controller on its own
// time). Give ctx a deadline: without one,
// a topic that never gets a leader is waited for until ctx is cancelled.
// It connects over PLAINTEXT; WaitTopicsReadyWith adds TLS and SASL.
func WaitTopicsReady(ctx context.Context, brokers []string, topics ...string) error {
	return WaitTopicsReadyWith(ctx, Security{}, brokers, topics...)
}

// WaitTopicsReadyWith is WaitTopicsReady connecting with s (TLS, SASL).
func WaitTopicsReadyWith(ctx context.Context, s Security, brokers []string, topics ...string) error {
	if len(topics) == 0 {
		return nil
	}
	transport := s.Transport()
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: transport}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		err := topicsReady(ctx, client, s.Dialer(), topics)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for topics %v to be ready: %w (last: %w)", topics, ctx.Err(), err)
		case <-t.C:
		}
	}
}

// topicsReady returns nil when every partition of topics has a leader that
// answers ListOffsets, or the first reason it does not.
func topicsReady(ctx context.Context, client *kafka.Client, d *kafka.Dialer, topics []string) error {
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	found := map[string]bool{}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, t := range md.Topics {
		if t.Error != nil {
			return fmt.Errorf("topic %s: %w", t.Name, t.Error)
		}
		if len(t.Partitions) == 0 {
			return fmt.Errorf("topic %s has no partitions yet", t.Name)
		}
		for _, p := range t.Partitions {
			if p.Error != nil {
				return fmt.Errorf("%s/%d: %w", t.Name, p.ID, p.Error)
			}
			if p.Leader.ID < 0 || p.Leader.Host == "" {
				return fmt.Errorf("%s/%d has no leader yet", t.Name, p.ID)
			}
			req.Topics[t.Name] = append(req.Topics[t.Name], kafka.LastOffsetOf(p.ID))
		}
		found[t.Name] = true
	}
	for _, name := range topics {
		if !found[name] {
			return fmt.Errorf("topic %s is not in the metadata yet", name)
		}
	}
	// In a cluster each broker learns of a new topic from the controller on
	// its own time, and a client asks whichever broker it likes: until every
	// live broker knows the topics, a consumer or a test reading metadata
	// right after can still be told they do not exist.
	if len(md.Brokers) > 1 {
		for _, b := range md.Brokers {
			if err := brokerKnows(ctx, d, b, topics); err != nil {
				return err
			}
		}
	}
	// The client sends each partition's request to the leader the metadata
	// names: an answer without error means that leader serves the partition.
	resp, err := client.ListOffsets(ctx, req)
	if err != nil {
		return fmt.Errorf("list offsets: %w", err)
	}
	var errs []error
	for name, parts := range resp.Topics {
		for _, p := range parts {
			if p.Error != nil {
				errs = append(errs, fmt.Errorf("%s/%d: %w", name, p.Partition, p.Error))
			}
		}
	}
	for name, want := range req.Topics {
		if len(resp.Topics[name]) != len(want) {
			errs = append(errs, fmt.Errorf("topic %s: %d of %d partitions answered", name, len(resp.Topics[name]), len(want)))
		}
	}
	return errors.Join(errs...)
}

// brokerKnows asks broker b itself, over a connection of its own (a
// client's transport may answer metadata from its cache, or from any
// broker), whether it knows every partition of topics with a leader.
func brokerKnows(ctx context.Context, d *kafka.Dialer, b kafka.Broker, topics []string) error {
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(b.Host, strconv.Itoa(b.Port)))
	if err != nil {
		return fmt.Errorf("dialing broker %d: %w", b.ID, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	}
	parts, err := conn.ReadPartitions(topics...)
	if err != nil {
		return fmt.Errorf("broker %d does not know %v yet: %w", b.ID, topics, err)
	}
	for _, p := range parts {
		if p.Leader.Host == "" {
			return fmt.Errorf("broker %d knows no leader of %s/%d yet", b.ID, p.Topic, p.ID)
		}
	}
	return nil
}
