//go:build standby

// These tests need a primary with a streaming standby, which `make test`'s
// single-server stack does not have; they run with the build tag standby
// (`make test-standby` starts such a server of its own and runs them).

package inbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Issue 32 (15/async/wal with the relays publishing only what the standby
// has: 33 orders without a charge): billing applied events, committed its
// Kafka offsets, then the asynchronous primary died before the standby had
// the charges. The promoted server lacked them, Kafka's offsets said they
// were done, and they were never delivered again. With CommitReplicated the
// offsets wait for the standby: while it is frozen the committed offset
// stays behind the handled message, and it moves once the standby has the
// work.
func TestStandbyConsumerCommitsOffsetsOnlyForWhatTheStandbyHas(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("CommitReplicated=%v", on), func(t *testing.T) {
			f := newFixture(t)
			group := testenv.Name("group")
			cfg := inbox.Config{Name: "test-consumer", CommitReplicated: on, Metrics: inbox.NewMetrics(f.Registry)}
			c, err := inbox.NewConsumer(f.Pool, f.Source(group), f.Writer, f.recordEffect, cfg)
			if err != nil {
				t.Fatal(err)
			}
			client := &kafka.Client{Addr: kafka.TCP(f.Brokers...)}
			committed := func() int64 {
				_, offs := endAndCommitted(t, client, f.Topic, group, 1)
				return offs[0]
			}
			running := inboxtesting.RunUntilCleanup(t, c)
			// One message handled and committed first: the group has an
			// offset, so what follows is a move of it, not its first.
			f.Produce(t, event.ToKafka(f.Topic, inboxtesting.NewEvent("a", 1)))
			testenv.WaitFor(t, 30*time.Second, "the first offset to be committed", func() (bool, error) {
				return committed() == 1, running()
			})

			thaw := testenv.FreezeStandby(t, f.Pool)
			f.Produce(t, event.ToKafka(f.Topic, inboxtesting.NewEvent("a", 2)))
			testenv.WaitFor(t, 30*time.Second, "the second event to be applied", func() (bool, error) {
				return f.Count(t, "SELECT count(*) FROM effects") == 2, running()
			})
			// Several commit intervals (1 s) with the standby frozen.
			deadline := time.Now().Add(3 * time.Second)
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for ; time.Now().Before(deadline); <-tick.C {
				if got := committed(); got != 1 {
					if on {
						t.Fatalf("offset %d committed while the standby had not flushed the work it counts: a failover to it would skip that message for good", got)
					}
					t.Logf("without CommitReplicated the offset moved to %d with the standby frozen (what the setting prevents)", got)
					return
				}
			}
			if !on {
				t.Fatal("without CommitReplicated the offset did not move in 3 s either: this test cannot tell the setting's effect")
			}
			if v := testenv.MetricValue(t, f.Registry, "inbox_standby_connected"); v != 0 {
				t.Errorf("inbox_standby_connected = %v while the standby is frozen, want 0", v)
			}
			thaw()
			testenv.WaitFor(t, 30*time.Second, "the offset to move once the standby has the work", func() (bool, error) {
				return committed() == 2, running()
			})
			testenv.WaitFor(t, 10*time.Second, "inbox_standby_connected to be 1 again", func() (bool, error) {
				return testenv.MetricValue(t, f.Registry, "inbox_standby_connected") == 1, running()
			})
		})
	}
}

// restartServer restarts the PostgreSQL server pool is on (pg_ctl restart,
// fast: a restart loses no commit), as the end of a failover looks to a
// client that stays up: the same URL now reaches a server that started
// later. The server must run on this machine, as this user.
func restartServer(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var dataDir, binDir string
	if err := pool.QueryRow(ctx, `SELECT current_setting('data_directory'), (SELECT setting FROM pg_config WHERE name = 'BINDIR')`).Scan(&dataDir, &binDir); err != nil {
		t.Fatalf("reading the server's data directory: %v", err)
	}
	// The server logs on where the dev stack has it log (devstack/stack.sh:
	// beside the data directory); pg_ctl refuses to run as root, and the
	// stack runs the server as postgres then.
	args := []string{filepath.Join(binDir, "pg_ctl"), "restart", "-D", dataDir, "-m", "fast", "-w", "-t", "60",
		"-l", filepath.Join(filepath.Dir(dataDir), "postgres.log")}
	if os.Geteuid() == 0 {
		args = append([]string{"runuser", "-u", "postgres", "--"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // the server outlives the test
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("restarting the server: %v\n%s", err, out)
	}
}

// Issue 32, what held-back offsets alone left (pgfailover, 15/async/wal,
// seed 11: 1 order of 171 without its charge): a consumer that stays up
// through a failover keeps fetching from where it was and, once the
// promoted server has a standby, commits past the work that died with the
// old one. With CommitReplicated it notices its database is another server
// (here a restart, which changes the server's start time as a promotion
// changes its address), drops the pending offsets and rejoins, so it reads
// again from the committed ones: what survived is absorbed as a duplicate,
// what was lost would be applied.
func TestStandbyConsumerRereadsWhatItDidBeforeItsDatabaseSwitchedServers(t *testing.T) {
	f := newFixture(t)
	group := testenv.Name("group")
	// A slot no standby has: offsets are never committed, as while a
	// standby is behind.
	cfg := inbox.Config{Name: "test-consumer", CommitReplicated: true, StandbySlots: []string{"no_standby_has_this_slot"},
		Metrics: inbox.NewMetrics(f.Registry)}
	c, err := inbox.NewConsumer(f.Pool, f.Source(group), f.Writer, f.recordEffect, cfg)
	if err != nil {
		t.Fatal(err)
	}
	running := inboxtesting.RunUntilCleanup(t, c)
	f.Produce(t, event.ToKafka(f.Topic, inboxtesting.NewEvent("a", 1)))
	testenv.WaitFor(t, 30*time.Second, "a/1 applied", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM effects") == 1, running()
	})

	restartServer(t, f.Pool)
	testenv.WaitFor(t, 60*time.Second, "a/1 read again after the switch (a duplicate the inbox absorbs)", func() (bool, error) {
		return testenv.MetricValue(t, f.Registry, "inbox_duplicates_total") >= 1, running()
	})
	if n := f.Count(t, "SELECT count(*) FROM effects"); n != 1 {
		t.Errorf("%d effects, want 1: the re-read message was applied again", n)
	}
	if v := testenv.MetricValue(t, f.Registry, "inbox_server_switches_total"); v < 1 {
		t.Errorf("inbox_server_switches_total = %v, want the switch counted", v)
	}
}
