package prove

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/pgroles"
)

// RELAY_MODE=debezium: orders runs no relay, and Kafka Connect with
// Debezium publishes its outbox from the connector file the docs ship
// (docs/debezium/orders-outbox-connector.json), byte for byte. The proofs
// about publishing (DebeziumProofs) run with Connect as the relay: started
// by devstack/connect.sh against this harness's stack (through its proxies,
// as every service), on the platform's own database, slot and topic, and
// SIGKILLed where the other modes kill the relay.

// DebeziumProofs are the relay-mode proofs (RelayModeProofs) that run in
// RELAY_MODE=debezium. chaos and the nemesis do not: their faults target the
// platform's own processes, crash points and slot, and Connect is none of
// them; with debezium alone in Options.RelayModes they run in poll.
var DebeziumProofs = map[string]bool{"atomicity": true, "relay-crash": true, "ordering": true}

// Debezium is a platform's Kafka Connect worker.
type Debezium struct {
	c     *harness.Connect
	slot  string
	admin func(ctx context.Context, slot string) (bool, error)
	kills kills
}

// debeziumSlot is the connector's slot for a platform whose orders database
// is db: slot names are global to the cluster, database names unique in it.
func debeziumSlot(db string) string { return db }

// startDebezium starts Connect for p, streaming as the replication role
// repl (REPLICATION and CONNECT, nothing else: what docs/debezium asks
// for), and returns once Debezium streams from its slot.
func (p *Platform) startDebezium(ctx context.Context, repl pgroles.Login) (*Debezium, error) {
	h := p.h
	c, err := harness.NewConnect(harness.ConnectConfig{
		Root: h.opts.Root, Dir: filepath.Join(p.Dir, "connect"), Brokers: h.stack.Brokers(),
		DBHost: "127.0.0.1", DBPort: h.stack.PGProxyPort, DBName: p.OrdersDB, DBUser: repl.Name, DBPassword: repl.Password,
		Slot: debeziumSlot(p.OrdersDB), Topic: p.OrdersTopic, Logf: h.logf,
	})
	if err != nil {
		return nil, err
	}
	d := &Debezium{c: c, slot: debeziumSlot(p.OrdersDB), admin: func(ctx context.Context, slot string) (bool, error) {
		var active bool
		err := h.stack.Admin.QueryRow(ctx,
			`SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)`, slot).Scan(&active)
		return active, err
	}}
	if err := d.up(ctx); err != nil {
		d.Stop()
		return nil, err
	}
	return d, nil
}

// up starts the worker and waits until Debezium streams from its slot:
// snapshot.mode no_data publishes only what commits after that.
func (d *Debezium) up(ctx context.Context) error {
	if err := d.c.Up(ctx); err != nil {
		return err
	}
	var last error
	if err := waitUntil(ctx, 60*time.Second, func() bool {
		active, err := d.admin(ctx, d.slot)
		last = err
		return err == nil && active
	}); err != nil {
		return fmt.Errorf("Debezium did not stream from slot %s (last error %v): %w\n%s", d.slot, last, err, harness.Tail(d.c.LogPath(), 30))
	}
	return nil
}

// Kill SIGKILLs the worker mid-stream: what it published since its last
// flushed offset (offset.flush.interval.ms, 1 s) is published again after
// Restart.
func (d *Debezium) Kill(ctx context.Context) error {
	if err := d.c.Kill(ctx); err != nil {
		return err
	}
	d.kills.add()
	return nil
}

// Restart starts the worker again after Kill and waits until it streams.
func (d *Debezium) Restart(ctx context.Context) error { return d.up(ctx) }

// Kills is how many times the worker was SIGKILLed.
func (d *Debezium) Kills() int { return d.kills.count() }

// LastKill is when the worker was last SIGKILLed.
func (d *Debezium) LastKill() time.Time { return d.kills.lastAt() }

// Stop stops the worker (SIGTERM), if it runs.
func (d *Debezium) Stop() { _ = d.c.Down(context.Background()) }

// stopLeftConnects stops the Connect workers a killed earlier run left
// behind under dir (they were started with setsid, so they outlive it):
// they would hold their slots, which the stack's cleanup then cannot drop.
func stopLeftConnects(ctx context.Context, root, dir string) {
	pids, _ := filepath.Glob(filepath.Join(dir, "runs", "*", "*", "connect", "connect.pid"))
	for _, pid := range pids {
		cdir := filepath.Dir(pid)
		c, err := harness.NewConnect(harness.ConnectConfig{Root: root, Dir: cdir, Brokers: []string{"-"}, DBName: "-", Slot: "-", Topic: "-"})
		if err == nil {
			_ = c.Down(ctx)
		}
		_ = os.Remove(pid)
	}
}

// relayCrashDebezium is relay-crash with Debezium as the relay: Kafka
// Connect is SIGKILLed mid-stream, again and again, and started again;
// everything arrives, and what Debezium published again after each kill is
// absorbed by the inboxes.
func (h *Harness) relayCrashDebezium(ctx context.Context) Row {
	var row Row
	p, err := h.newPlatform(ctx, "relay-crash", Setup{})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	want := h.prof.ConnectKills
	d := newDriver(p.API.URL(), p.Name)
	h.logf("  placing orders while Kafka Connect is SIGKILLed %d times mid-stream …", want)
	driveCtx, stopDriving := context.WithCancel(ctx)
	defer stopDriving()
	driven := make(chan struct{})
	go func() {
		defer close(driven)
		d.Drive(driveCtx, 3, 40, h.prof.Orders, h.prof.Orders*30, func() bool { return p.Connect.Kills() >= want })
	}()
	for p.Connect.Kills() < want && ctx.Err() == nil {
		// Some orders first, so that each kill lands while Debezium streams.
		before, _, _ := d.Stats()
		if err := waitUntil(ctx, 60*time.Second, func() bool { n, _, _ := d.Stats(); return n >= before+20 }); err != nil {
			row.Error = fmt.Sprintf("orders stopped being taken: %v", err)
			break
		}
		if err := p.Connect.Kill(ctx); err != nil {
			row.Error = err.Error()
			break
		}
		if err := p.Connect.Restart(ctx); err != nil {
			row.Error = err.Error()
			break
		}
	}
	if row.Error != "" {
		stopDriving() // the kills cannot go on: audit what was placed
	}
	<-driven
	a, quietAt, err := h.settleAndAudit(ctx, p, d)
	if err != nil {
		return fail(row, err)
	}
	row.Faults, row.Absorbed = p.Connect.Kills(), p.absorbed()
	row.FaultsDesc = fmt.Sprintf("%d SIGKILLs of Kafka Connect (Debezium) mid-stream, each started again", row.Faults)
	row.RecoverySeconds = recoverySince(p.Connect.LastKill(), quietAt)
	row.check(row.Faults >= want, "Kafka Connect was killed at least %d times (%d)", want, row.Faults)
	row.check(a.EventlessOrders == 0, "no order without its event (%d)", a.EventlessOrders)
	row.check(row.Absorbed > 0, "republished duplicates reached the consumers and were absorbed (%d)", row.Absorbed)
	endToEnd(&row, a)
	return row
}
