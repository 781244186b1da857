package inboxadmin_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestListDeadLettersShowsWhyAndWhereOldestFirst(t *testing.T) {
	t.Parallel()
	s := newDLTScenario(t)
	ctx := context.Background()

	dls, err := inboxadmin.ListDeadLetters(ctx, s.brokers, s.dlt, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 {
		t.Fatalf("listed %d dead letters, want 2: %+v", len(dls), dls)
	}
	want := []inboxadmin.DeadLetter{
		{Partition: 0, Offset: 0, Reason: "unknown ThingHappened version 2", Consumer: "billing",
			OriginalTopic: s.original, OriginalPartition: 0, OriginalOffset: 7, FailedAt: s.failedAtA,
			EventID: s.a.EventID, EventType: "ThingHappened", AggregateID: "order-a",
			KeySize: len("order-a"), ValueSize: len(s.originalA.Value)},
		{Partition: 0, Offset: 1, Reason: "gave up after 5 attempts: downstream down", Consumer: "billing",
			OriginalTopic: s.original, OriginalPartition: 0, OriginalOffset: 8, FailedAt: s.failedAtB,
			EventID: s.b.EventID, EventType: "PaymentCaptured", AggregateID: "order-b",
			KeySize: len("order-b"), ValueSize: len(s.originalB.Value)},
	}
	for i, d := range dls {
		if d.Time.IsZero() || !d.FailedAt.Equal(want[i].FailedAt) {
			t.Fatalf("dead letter %d: time %v, failed at %v; want a time and failed at %v", i, d.Time, d.FailedAt, want[i].FailedAt)
		}
		d.Time, d.FailedAt = time.Time{}, want[i].FailedAt
		if d != want[i] {
			t.Fatalf("dead letter %d:\n got %+v\nwant %+v", i, d, want[i])
		}
	}

	one, err := inboxadmin.ListDeadLetters(ctx, s.brokers, s.dlt, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != 1 || one[0].EventID != s.a.EventID {
		t.Fatalf("limit 1 listed %+v, want only the oldest (a)", one)
	}
	// Listing commits nothing: a second listing sees the same.
	again, err := inboxadmin.ListDeadLetters(ctx, s.brokers, s.dlt, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 2 || again[0].Offset != 0 || again[1].Offset != 1 {
		t.Fatalf("second listing = %+v, want the same two", again)
	}
	// Listing touches neither the inbox nor the original topic.
	if rows := inboxtesting.Rows(t, s.pool); len(rows) != 3 {
		t.Fatalf("inbox rows after listing = %q, want the 3 seeded", rows)
	}
	readAll(t, s.brokers, s.original, 0)
}

func TestListDeadLettersMergesPartitionsByAppendTime(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	dlt := testenv.NewTopic(t, brokers, 2)
	// A writer that puts each message on the partition it names, with the
	// timestamp it names.
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        dlt,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 2 * time.Millisecond,
		Transport:    &kafka.Transport{MetadataTTL: time.Second},
	}
	defer w.Close()
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	type placed struct {
		partition int
		at        time.Duration
		reason    string
	}
	for _, p := range []placed{{1, 0, "first"}, {0, time.Second, "second"}, {1, 2 * time.Second, "third"}, {0, 3 * time.Second, "fourth"}} {
		m := asDeadLetter(dlt, kafka.Message{Topic: "orig", Key: []byte("k"), Value: []byte("not an event")}, "billing", p.reason, 0, t0)
		m.Topic, m.Partition, m.Time = "", p.partition, t0.Add(p.at)
		if err := w.WriteMessages(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		limit int
		want  string
	}{
		{10, "first@1/0 second@0/0 third@1/1 fourth@0/1"},
		{3, "first@1/0 second@0/0 third@1/1"},
		{1, "first@1/0"},
	} {
		dls, err := inboxadmin.ListDeadLetters(context.Background(), brokers, dlt, tt.limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range dls {
			if d.EventID != uuid.Nil || d.EventType != "" {
				t.Fatalf("a message that is not an event listed with event %v %q", d.EventID, d.EventType)
			}
			got = append(got, fmt.Sprintf("%s@%d/%d", d.Reason, d.Partition, d.Offset))
		}
		if strings.Join(got, " ") != tt.want {
			t.Fatalf("limit %d listed %v, want %s", tt.limit, got, tt.want)
		}
	}
}

func TestListDeadLettersOfAnEmptyOrMissingTopic(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	empty := testenv.NewTopic(t, brokers, 3)
	dls, err := inboxadmin.ListDeadLetters(context.Background(), brokers, empty, 10)
	if err != nil || len(dls) != 0 {
		t.Fatalf("empty topic listed %v, %v; want nothing and no error", dls, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = inboxadmin.ListDeadLetters(ctx, brokers, testenv.Name("missing"), 10)
	if !errors.Is(err, kafka.UnknownTopicOrPartition) {
		t.Fatalf("missing topic: error %v, want one wrapping kafka.UnknownTopicOrPartition", err)
	}
}

// TestDeadLetterAdminUsesTheGivenDialer points a TLS dialer at the dev
// stack's PLAINTEXT Kafka: listing and requeueing must then fail to connect,
// which shows that WithDialer's dialer (not a plain one built inside) reaches
// every client they open, while the default still reads the topic.
func TestDeadLetterAdminUsesTheGivenDialer(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	dlt := testenv.NewTopic(t, brokers, 2)
	if _, err := inboxadmin.ListDeadLetters(context.Background(), brokers, dlt, 10); err != nil {
		t.Fatalf("listing with the default dialer: %v", err)
	}
	tlsDialer := &kafka.Dialer{Timeout: 3 * time.Second, TLS: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // never verified: the handshake must fail first
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := inboxadmin.ListDeadLetters(ctx, brokers, dlt, 10, inboxadmin.WithDialer(tlsDialer)); err == nil {
		t.Fatal("ListDeadLetters over TLS to a PLAINTEXT broker succeeded: the given dialer was not used")
	}
	w := testenv.NewWriter(brokers, 10)
	defer w.Close()
	_, err := inboxadmin.RequeueDeadLetters(ctx, inboxtest.NewDatabase(t), w, brokers, dlt, inboxadmin.RequeueFilter{All: true}, inboxadmin.WithDialer(tlsDialer))
	if err == nil {
		t.Fatal("RequeueDeadLetters over TLS to a PLAINTEXT broker succeeded: the given dialer was not used")
	}
	if ctx.Err() != nil {
		t.Fatalf("the TLS attempts took until the deadline instead of failing to connect: %v", err)
	}
}
