//go:build standby

// These tests need a primary with a streaming standby, which `make test`'s
// single-server stack does not have; they run with the build tag standby
// (`make test-standby` starts such a server of its own and runs them).

package cdc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// standbyBehind reports the primary's flush position and the standbys'
// lowest, for the failure message.
func standbyBehind(pool *pgxpool.Pool) string {
	var primary, standby string
	_ = pool.QueryRow(context.Background(), `SELECT pg_current_wal_flush_lsn()::text,
		coalesce((SELECT min(restart_lsn)::text FROM pg_replication_slots WHERE slot_type = 'physical'), 'none')`).Scan(&primary, &standby)
	return fmt.Sprintf("the primary flushed %s, the standby %s", primary, standby)
}

// holdsNothing fails the test if anything reaches the collector while the
// standby is frozen, watching for the given time: the claim that nothing is
// published needs that time, the only wait that cannot end early.
func holdsNothing(t *testing.T, c *collector, pool *pgxpool.Pool, watch time.Duration) {
	t.Helper()
	deadline := time.Now().Add(watch)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		<-tick.C
		if n := c.Distinct(); n > 0 {
			t.Fatalf("%d event(s) published while the standby had not flushed their commit (%s): "+
				"a failover to it would take back what consumers already saw", n, standbyBehind(pool))
		}
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, label, value) {
				return m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func matches(m *dto.Metric, label, value string) bool {
	if label == "" {
		return true
	}
	for _, l := range m.GetLabel() {
		if l.GetName() == label && l.GetValue() == value {
			return true
		}
	}
	return false
}

// Issue 32: a commit is visible on the primary before the standby has it
// (asynchronous replication always; synchronous while the commit waits,
// and for good once its client gives up), and the polling relay published
// it: a failover then took back an order whose capture the third party
// kept (17/sync/poll, 2 findings). With Standby.PublishReplicated the relay
// holds a claimed row until the standbys flushed its commit; a wait that
// runs out is an outage (the row stays pending, no attempt charged), and
// the row goes once the standby catches up.
func TestStandbyPollingRelayPublishesOnlyWhatTheStandbyHas(t *testing.T) {
	e := newRelayEnv(t, 1, 10)
	reg := prometheus.NewRegistry()
	relay, err := outbox.NewRelay(e.Pool, e.W, outbox.RelayConfig{
		Topic: e.TopicFn, Metrics: outbox.NewMetrics(reg), PollInterval: 50 * time.Millisecond,
		OutageBackoffMax: 200 * time.Millisecond,
		Standby:          outbox.Standby{PublishReplicated: true, ReplicatedWait: 500 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "Run", relay.Run)

	thaw := testenv.FreezeStandby(t, e.Pool)
	enqueue(t, e.Pool, newEvent("a", 1))
	holdsNothing(t, e.C, e.Pool, 2*time.Second)
	if n := counterValue(t, reg, "outbox_standby_waits_total", "outcome", "timeout"); n == 0 {
		t.Errorf("outbox_standby_waits_total{outcome=timeout} is 0 after 2s with the standby frozen; want the outage counted")
	}
	if n := countRows(t, e.Pool, "state = 'pending' AND attempts = 0"); n != 1 {
		t.Errorf("%d rows pending with no attempt charged while the standby was behind, want 1 (an outage is no row's fault)", n)
	}
	thaw()
	testenv.WaitFor(t, 20*time.Second, "the event once the standby has it", func() (bool, error) { return e.C.Distinct() == 1, nil })
	if n := counterValue(t, reg, "outbox_standby_behind", "", ""); n != 0 {
		t.Errorf("outbox_standby_behind is %v after the standby caught up, want 0", n)
	}
}

// Issue 32: on PostgreSQL 15 the log-based relay decodes a commit the
// standby does not have yet, and published it (15/sync/cdc, 49 findings);
// synchronized_standby_slots, which makes the walsender wait, exists from
// 17 only. With Standby.PublishReplicated the relay waits at each
// transaction's begin until the standbys flushed past the commit.
func TestStandbyCDCRelayPublishesOnlyWhatTheStandbyHas(t *testing.T) {
	e := newCDCEnv(t, 1, 10)
	cfg := e.config()
	cfg.Standby = outbox.Standby{PublishReplicated: true, ReplicatedWait: 500 * time.Millisecond}
	cfg.OutageBackoffMax = 200 * time.Millisecond
	runStreaming(t, newCDC(t, e.Pool, e.W, cfg))

	thaw := testenv.FreezeStandby(t, e.Pool)
	enqueue(t, e.Pool, newEvent("a", 1))
	holdsNothing(t, e.C, e.Pool, 2*time.Second)
	thaw()
	testenv.WaitFor(t, 20*time.Second, "the event once the standby has it", func() (bool, error) { return e.C.Distinct() == 1, nil })
}
