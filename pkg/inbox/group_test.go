package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// member is one consumer of the group, as one instance of a service.
type member struct {
	cancel context.CancelFunc
	done   chan error
	reg    *prometheus.Registry
}

// groupRig is a topic of several partitions, a steady producer, and the
// members of one group consuming it into an effects table that keeps every
// application (no unique key), so a second application of an event shows.
type groupRig struct {
	f       *fixture
	group   string
	stopped chan struct{}
	sent    atomic.Int64
	wg      sync.WaitGroup
}

const groupPartitions = 6

func newGroupRig(t *testing.T) *groupRig {
	t.Helper()
	f := newFixture(t)
	f.Topic = testenv.NewTopic(t, f.Brokers, groupPartitions)
	testenv.NewTopicNamed(t, f.Brokers, f.Topic+".dlt", 1) // Run refuses to start without it
	if _, err := f.Pool.Exec(context.Background(), `CREATE TABLE applied (
		seq bigserial PRIMARY KEY, event_id uuid NOT NULL, aggregate_id text NOT NULL, version bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &groupRig{f: f, group: testenv.Name("group"), stopped: make(chan struct{})}
}

// start joins a new member. Its ShutdownGrace is a millisecond: cancelling
// it abandons whatever it holds, uncommitted, as a killed process would.
func (r *groupRig) start(t *testing.T) *member {
	t.Helper()
	m := &member{done: make(chan error, 1), reg: prometheus.NewRegistry()}
	src := inbox.GroupConfig{Brokers: r.f.Brokers, Topic: r.f.Topic, Group: r.group,
		HeartbeatInterval: 200 * time.Millisecond, SessionTimeout: 6 * time.Second, RebalanceTimeout: 4 * time.Second}
	c, err := inbox.NewConsumer(r.f.Pool, src, r.f.Writer, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (event_id, aggregate_id, version) VALUES ($1, $2, $3)`,
			ev.EventID, ev.AggregateID, ev.AggregateVersion)
		return err
	}, inbox.Config{Name: "members", Workers: 3, BatchSize: 20, LagInterval: 100 * time.Millisecond,
		ShutdownGrace: time.Millisecond, Metrics: inbox.NewMetrics(m.reg)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() { m.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.kill(t, m) })
	return m
}

// kill cancels m without a grace, and checks that Run returned nil at once.
func (r *groupRig) kill(t *testing.T, m *member) {
	t.Helper()
	if m.cancel == nil {
		return
	}
	m.cancel()
	m.cancel = nil
	select {
	case err := <-m.done:
		if err != nil {
			t.Errorf("member's Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("a cancelled member's Run did not return within 15s")
	}
}

// produce writes a steady stream (a batch every 20ms) over 24 keys, each
// key's versions in order, until stop.
func (r *groupRig) produce(t *testing.T) {
	t.Helper()
	versions := map[string]int64{}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for i := 0; ; i++ {
			select {
			case <-r.stopped:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var msgs []kafka.Message
			for k := range 8 {
				key := fmt.Sprintf("key-%d", (i*8+k)%24)
				versions[key]++
				msgs = append(msgs, event.ToKafka(r.f.Topic, inboxtesting.NewEvent(key, versions[key])))
			}
			// A new topic's leadership can still move (Not Leader For
			// Partition): write the batch again, as the relay would. Copies
			// of events that did land are duplicates the inbox absorbs.
			var err error
			for try := 0; try < 50; try++ {
				if err = r.f.Writer.WriteMessages(context.Background(), msgs...); err == nil {
					break
				}
				<-time.After(100 * time.Millisecond)
			}
			if err != nil {
				t.Errorf("producing: %v", err)
				return
			}
			r.sent.Add(int64(len(msgs)))
		}
	}()
}

func (r *groupRig) stopProducing() {
	close(r.stopped)
	r.wg.Wait()
}

func (r *groupRig) applied(t *testing.T) int {
	return r.f.Count(t, "SELECT count(DISTINCT event_id) FROM applied")
}

// progress waits until the members applied 60 more events than now.
func (r *groupRig) progress(t *testing.T, after string) {
	t.Helper()
	from := r.applied(t)
	testenv.WaitFor(t, 45*time.Second, "progress after "+after, func() (bool, error) {
		return r.applied(t) >= from+60, nil
	})
}

// check waits for the group to catch up with everything sent, then audits:
// every event applied once, each key's versions applied in order, every
// partition's committed offset at its end offset, lag 0 on a live member.
func (r *groupRig) check(t *testing.T, live *member) {
	t.Helper()
	sent := int(r.sent.Load())
	testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("all %d events to be applied", sent), func() (bool, error) {
		return r.applied(t) == sent, nil
	})
	if n := r.f.Count(t, `SELECT count(*) FROM (SELECT event_id FROM applied GROUP BY event_id HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d events applied more than once", n)
	}
	if n := r.f.Count(t, `SELECT count(*) FROM (
		SELECT version, lag(version, 1, 0::bigint) OVER (PARTITION BY aggregate_id ORDER BY seq) AS prev FROM applied) a
		WHERE version <> prev + 1`); n != 0 {
		t.Errorf("%d applications out of per-key order", n)
	}
	client := &kafka.Client{Addr: kafka.TCP(r.f.Brokers...), Timeout: 5 * time.Second}
	var lastSeen string
	testenv.WaitFor(t, 30*time.Second, "every partition's committed offset to reach its end", func() (bool, error) {
		ends, committed := endAndCommitted(t, client, r.f.Topic, r.group, groupPartitions)
		lastSeen = fmt.Sprintf("end %v, committed %v", ends, committed)
		for p, end := range ends {
			if committed[p] != end {
				return false, nil
			}
		}
		return true, nil
	})
	t.Logf("offsets: %s", lastSeen)
	testenv.WaitFor(t, 10*time.Second, "consumer_lag_messages to be 0 on every partition", func() (bool, error) {
		return testenv.MetricValue(t, live.reg, "consumer_lag_messages") == 0 &&
			testenv.LabeledMetricValue(t, live.reg, "consumer_lag_messages", map[string]string{"partition": "0"}) == 0, nil
	})
}

// endAndCommitted returns each partition's end offset and the group's
// committed offset (-1: none).
func endAndCommitted(t *testing.T, client *kafka.Client, topic, group string, partitions int) (ends, committed map[int]int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var reqs []kafka.OffsetRequest
	var ids []int
	for p := range partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p))
		ids = append(ids, p)
	}
	listed, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		t.Fatalf("listing offsets: %v", err)
	}
	fetched, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		t.Fatalf("fetching committed offsets: %v", err)
	}
	ends, committed = map[int]int64{}, map[int]int64{}
	for _, p := range listed.Topics[topic] {
		ends[p.Partition] = p.LastOffset
	}
	for _, p := range fetched.Topics[topic] {
		committed[p.Partition] = p.CommittedOffset
	}
	return ends, committed
}

// membersScenario runs n members of one group under a steady stream, then
// kills two of them abruptly and starts two more, each change mid-stream.
func membersScenario(t *testing.T, n int) {
	r := newGroupRig(t)
	r.produce(t)
	var members []*member
	for i := range n {
		members = append(members, r.start(t))
		r.progress(t, fmt.Sprintf("member %d joined", i+1))
	}
	for i := range 2 {
		r.kill(t, members[i])
		r.progress(t, fmt.Sprintf("member %d was killed", i+1))
		members = append(members, r.start(t))
		r.progress(t, "a new member joined")
	}
	r.stopProducing()
	r.check(t, members[len(members)-1])
}

func TestTwoMembersOfOneGroupThroughJoinsAndKills(t *testing.T) {
	t.Parallel()
	membersScenario(t, 2)
}

func TestThreeMembersOfOneGroupThroughJoinsAndKills(t *testing.T) {
	t.Parallel()
	membersScenario(t, 3)
}
