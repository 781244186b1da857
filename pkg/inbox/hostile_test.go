package inbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// bigMessage is larger than a dead-letter writer's BatchBytes (kafka-go's
// default, 1 MiB) and than the broker's default message.max.bytes, so it can
// be dead-lettered only truncated.
const bigMessage = 3 << 19 // 1.5 MiB

// deadLetterBodyLimit is how much of a refused value a truncated dead letter
// keeps: the 64 KiB HeaderDLTTruncated's doc promises.
const deadLetterBodyLimit = 64 << 10

// newTopicTakingBigMessages creates a topic whose max.message.bytes admits
// bigMessage (the dev stack's broker keeps Kafka's default of about 1 MiB).
func newTopicTakingBigMessages(t *testing.T, brokers []string) string {
	t.Helper()
	name := testenv.Name("big")
	testenv.NewTopicNamed(t, brokers, name, 1, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: fmt.Sprint(4 << 20)})
	return name
}

// hostile is one message no retry can fix, and what its dead letter must say.
type hostile struct {
	name   string
	msg    kafka.Message
	reason string // the dlt-reason header mentions it
}

func hostileMessages(topic string) []hostile {
	nulID := inboxtesting.NewEvent("order\x00-1", 1)
	badType := inboxtesting.NewEvent("order-2", 1)
	badType.EventType = "Order\xffPlaced"
	// The handler stores this event's note in a text column; Postgres
	// refuses the NUL in it (SQLSTATE 22021), which no retry changes.
	nulNote := inboxtesting.NewEvent("order-3", 1)
	nulNote.EventType, nulNote.Payload = "NoteAdded", []byte(`{"note":"a\u0000b"}`)
	big := kafka.Message{Topic: topic, Key: []byte("order-4"), Value: bytes.Repeat([]byte("x"), bigMessage)}
	return []hostile{
		{"NUL in the aggregate id", event.ToKafka(topic, nulID), "aggregate id holds a NUL"},
		{"invalid UTF-8 in the event type", event.ToKafka(topic, badType), "event type is not valid UTF-8"},
		{"a handler error that is SQLSTATE 22021", event.ToKafka(topic, nulNote), "22021"},
		{"a message larger than the dead-letter writer takes", big, "event-id"},
	}
}

// applyNote is the side effect both modes run: a row per event, with the
// payload's note in a text column.
func applyNote(ctx context.Context, exec func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error), ev event.Envelope) error {
	var p struct{ Note string }
	if err := ev.DecodePayload(&p); err != nil {
		return err
	}
	_, err := exec(ctx, "INSERT INTO effects (event_id, aggregate_id) VALUES ($1, $2)", ev.EventID, ev.AggregateID+p.Note)
	return err
}

// Every hostile message is dead-lettered with its reason and coordinates,
// the partition moves on (the good event behind them is handled and the
// group's offset reaches the end), and the consumer keeps running; in both
// modes.
func TestHostileMessagesNeverStopAPartition(t *testing.T) {
	t.Parallel()
	inBothModes(t, func(t *testing.T, f *fixture, mode string) {
		f.Topic = newTopicTakingBigMessages(t, f.Brokers)
		dlt := testenv.NewTopic(t, f.Brokers, 1)
		hs := hostileMessages(f.Topic)
		good := inboxtesting.NewEvent("order-5", 1)
		// A transport of its own: the default one caches topic metadata
		// from before this topic existed. Timeouts of 30s rather than
		// kafka-go's 10s: a 1.5 MiB acks=all write on a loaded 2-core
		// machine took longer once ("i/o timeout"), and retrying a write
		// that may have landed would produce a hostile message twice.
		big := kafka.Writer{Addr: kafka.TCP(f.Brokers...), RequiredAcks: kafka.RequireAll, BatchBytes: 4 << 20,
			BatchTimeout: time.Millisecond, WriteTimeout: 30 * time.Second, ReadTimeout: 30 * time.Second,
			Transport: &kafka.Transport{MetadataTTL: 200 * time.Millisecond}}
		defer big.Close()
		msgs := []kafka.Message{}
		for _, h := range hs {
			msgs = append(msgs, h.msg)
		}
		msgs = append(msgs, event.ToKafka(f.Topic, good))
		for len(msgs) > 0 {
			var err error
			testenv.WaitFor(t, 90*time.Second, "the new topic to take messages", func() (bool, error) {
				err = big.WriteMessages(context.Background(), msgs[0])
				return !errors.Is(err, kafka.UnknownTopicOrPartition), nil
			})
			if err != nil {
				t.Fatalf("producing: %v", err)
			}
			msgs = msgs[1:]
		}

		group := testenv.Name("group")
		cfg := inbox.Config{Name: "hostile-" + mode, DeadLetterTopic: dlt, Metrics: inbox.NewMetrics(f.Registry),
			BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond}
		running := inboxtesting.RunUntilCleanup(t, f.modeConsumer(t, mode, f.Pool, group, applyNote, cfg))

		testenv.WaitFor(t, 30*time.Second, "the good event behind the hostile ones", func() (bool, error) {
			return f.Count(t, "SELECT count(*) FROM effects WHERE event_id = $1", good.EventID) == 1, running()
		})

		r := kafka.NewReader(kafka.ReaderConfig{Brokers: f.Brokers, Topic: dlt, Partition: 0, MaxWait: 100 * time.Millisecond})
		defer r.Close()
		rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer rcancel()
		// Different keys go to different workers, so dead letters
		// arrive in any order; each names its original offset.
		byOffset := map[string]kafka.Message{}
		for range hs {
			m, err := r.ReadMessage(rctx)
			if err != nil {
				t.Fatalf("reading dead letters (%d of %d read): %v", len(byOffset), len(hs), err)
			}
			for _, kv := range m.Headers {
				if kv.Key == inboxadmin.HeaderDLTOffset {
					byOffset[string(kv.Value)] = m
				}
			}
		}
		for i, h := range hs {
			m, ok := byOffset[fmt.Sprint(i)]
			if !ok {
				t.Errorf("%s: no dead letter names offset %d", h.name, i)
				continue
			}
			hdr := map[string]string{}
			for _, kv := range m.Headers {
				hdr[kv.Key] = string(kv.Value)
			}
			if !strings.Contains(hdr[inboxadmin.HeaderDLTReason], h.reason) {
				t.Errorf("%s: dlt-reason %q, want it to mention %q", h.name, hdr[inboxadmin.HeaderDLTReason], h.reason)
			}
			if strings.Contains(hdr[inboxadmin.HeaderDLTReason], "gave up after") {
				t.Errorf("%s: retried as if transient (%q); want it dead-lettered at once", h.name, hdr[inboxadmin.HeaderDLTReason])
			}
			if hdr[inboxadmin.HeaderDLTTopic] != f.Topic || hdr[inboxadmin.HeaderDLTPartition] != "0" {
				t.Errorf("%s: dead letter names %s/%s, want %s/0", h.name, hdr[inboxadmin.HeaderDLTTopic], hdr[inboxadmin.HeaderDLTPartition], f.Topic)
			}
			if len(h.msg.Value) == bigMessage {
				if hdr[inboxadmin.HeaderDLTTruncated] != fmt.Sprint(bigMessage) || len(m.Value) != deadLetterBodyLimit ||
					!bytes.Equal(m.Value, h.msg.Value[:deadLetterBodyLimit]) {
					t.Errorf("%s: dead letter of %d bytes with %s=%q, want the first %d bytes and the original size",
						h.name, len(m.Value), inboxadmin.HeaderDLTTruncated, hdr[inboxadmin.HeaderDLTTruncated], deadLetterBodyLimit)
				}
			}
		}
		client := &kafka.Client{Addr: kafka.TCP(f.Brokers...), Timeout: 5 * time.Second}
		testenv.WaitFor(t, 10*time.Second, "the group's offset to pass every message", func() (bool, error) {
			ends, committed := endAndCommitted(t, client, f.Topic, group, 1)
			return committed[0] == ends[0] && ends[0] == int64(len(hs)+1), nil
		})
		// Each one once: no dead letter is published again on a retry.
		ends, _ := endAndCommitted(t, client, dlt, testenv.Name("none"), 1)
		if ends[0] != int64(len(hs)) {
			t.Errorf("%d dead letters, want %d", ends[0], len(hs))
		}
	})
}
