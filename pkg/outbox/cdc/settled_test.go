package cdc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// refuseSettledReads makes the database refuse the relay's read of its
// rows' states before publishing (the statement that unnests the ids and
// event ids it checks), as a Postgres restarting or a timeout would, and
// nothing else: the relay's other reads of outbox_events (its holds) and
// its writes go through. A row-level security policy does it, so the relay
// must run as a role that is neither superuser nor the table's owner
// (relayURL). heal lets the reads through again.
func refuseSettledReads(t *testing.T, url string) (relayURL string, heal func()) {
	t.Helper()
	ctx := context.Background()
	admin := testenv.NewPool(t, url)
	relayURL = testenv.RuntimeRole(t, url)
	role := strings.SplitN(strings.TrimPrefix(relayURL, "postgres://"), ":", 2)[0]
	for _, stmt := range []string{
		`ALTER ROLE ` + role + ` REPLICATION`,
		`CREATE TABLE test_refuse_settled_reads (on_ boolean)`,
		`INSERT INTO test_refuse_settled_reads VALUES (true)`,
		`GRANT SELECT ON test_refuse_settled_reads TO ` + role,
		`CREATE FUNCTION test_settled_read_allowed() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
		 BEGIN
		     IF current_query() LIKE '%unnest(%' AND EXISTS (SELECT 1 FROM test_refuse_settled_reads) THEN
		         RAISE EXCEPTION 'injected: the read of the rows'' states failed';
		     END IF;
		     RETURN true;
		 END $$`,
		`ALTER TABLE outbox_events ENABLE ROW LEVEL SECURITY`,
		`CREATE POLICY test_everything ON outbox_events USING (true) WITH CHECK (true)`,
		`CREATE POLICY test_refuse_settled_reads ON outbox_events AS RESTRICTIVE FOR SELECT USING (test_settled_read_allowed())`,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return relayURL, func() {
		if _, err := admin.Exec(ctx, `DELETE FROM test_refuse_settled_reads`); err != nil {
			t.Fatal(err)
		}
	}
}

// A row that went dead while the slot had not confirmed past it comes
// again with the next stream, which must not publish it: it would reach
// consumers although it is dead, and its requeued copy later would come
// after the aggregate's next events (invariant 4). Before publishing such
// rows the relay reads their states (dropSettled); when the database
// refuses that read, the relay used to give up after a few attempts and
// publish them all. It must end the stream instead, unacknowledged, as a
// failed dead mark does, and read again on the next one.
func TestCDCDeadRowRestreamedWhileItsStateCannotBeReadStaysOffTheTopic(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 10)
	cfg := e.config()
	cfg.OutageBackoffMin, cfg.OutageBackoffMax = 20*time.Millisecond, 100*time.Millisecond
	// The slot exists, and is confirmed up to here.
	stop := runStreaming(t, newCDC(t, e.Pool, e.W, cfg))
	stop()

	// a/1 commits while no relay runs, and goes dead before one streams it:
	// as the row a relay skipped as dead just before it stopped, unconfirmed.
	a1 := newEvent("a", 1)
	enqueue(t, e.Pool, a1)
	where1 := "event_id = '" + a1.EventID.String() + "'"
	if _, err := e.Pool.Exec(context.Background(),
		`UPDATE outbox_events SET state = 'dead', last_error = 'refused by the broker' WHERE `+where1); err != nil {
		t.Fatal(err)
	}

	relayURL, heal := refuseSettledReads(t, e.URL)
	reg := prometheus.NewRegistry()
	cfg.Metrics = outbox.NewMetrics(reg)
	relay := newCDC(t, testenv.NewPool(t, relayURL), e.W, cfg)
	runCDC(t, relay)
	// Either the relay publishes a/1 without its state (the bug), or every
	// attempt of one stream's check is refused and the next stream's too
	// (3 attempts each): the relay ended the stream and read again.
	testenv.WaitFor(t, 30*time.Second, "a/1 published, or the relay's reads refused on two streams", func() (bool, error) {
		return e.C.Has(a1.EventID) ||
			testenv.LabeledMetricValue(t, reg, "outbox_db_errors_total", map[string]string{"op": "slot"}) >= 6, nil
	})
	if e.C.Has(a1.EventID) {
		t.Fatalf("a/1 is on the topic: the relay published a dead row because it could not read its state")
	}

	heal()
	a2 := newEvent("a", 2)
	enqueue(t, e.Pool, a2)
	testenv.WaitFor(t, 30*time.Second, "a/2 held back behind the dead a/1", func() (bool, error) {
		return countRows(t, e.Pool, "event_id = '"+a2.EventID.String()+"' AND state = 'dead'") == 1, nil
	})
	if e.C.Has(a1.EventID) || e.C.Has(a2.EventID) {
		t.Errorf("on the topic: a/1 %v, a/2 %v; want neither: a/1 is dead, and a/2 waits behind it", e.C.Has(a1.EventID), e.C.Has(a2.EventID))
	}
}
