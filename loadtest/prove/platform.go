package prove

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/pgroles"
)

// Setup says which processes a proof runs and how.
type Setup struct {
	// PublishMode and InboxMode are the services' modes (outbox/naive, inbox/naive).
	PublishMode, InboxMode string
	// Relays is the number of orders processes (each runs a relay). Default 1.
	Relays int
	// Billings and Shims are the numbers of billing and shim instances, each
	// kind one consumer group. Default 1.
	Billings, Shims int
	// APIOnly adds an orders process without a relay, which the driver uses.
	APIOnly bool
	// NoDownstream runs no billing, shim or reconciler (ordering).
	NoDownstream bool
	// Arm functions give the extra environment of each (re)start.
	OrdersArm, BillingArm, ShimArm func() map[string]string
	// ReconcilerTimeout is the shim's RECONCILER_TIMEOUT. Default 5s.
	ReconcilerTimeout string
}

// The kinds of instance a proof can add mid-run (Platform.Add).
const (
	KindRelay   = "orders"
	KindBilling = "billing"
	KindShim    = "shim"
)

// Platform is one proof's copy of the system: its own databases, topics,
// processes and ledger, on the harness's stack.
type Platform struct {
	h                       *Harness
	Name, Dir               string
	OrdersTopic, BillingTop string
	OrdersDB, BillingDB     string // database names
	ShimDB                  string
	Orders                  []*Proc // relays (and the API, unless APIOnly)
	API                     *Proc   // the orders process the driver talks to
	// Billings and Shims are every instance of each consumer, in the order
	// they were added; Billing and Shim are the first of each.
	Billings, Shims      []*Proc
	Billing, Shim, Recon *Proc
	ordersPool           *pgxpool.Pool
	billingPool          *pgxpool.Pool
	shimPool             *pgxpool.Pool
	all                  []*Proc
	// newInstance builds the next instance of a kind (KindRelay,
	// KindBilling, KindShim), not started.
	newInstance map[string]func() (*Proc, error)
	// BillingGroup and ShimGroup are the consumer groups, the platform's
	// own: proofs that run at the same time must not share a group.
	BillingGroup, ShimGroup string
	// Connect publishes orders' outbox in RELAY_MODE=debezium (nil in the
	// other modes): Kafka Connect with Debezium and the shipped connector
	// file, on this platform's database, slot and topic (debezium.go).
	Connect *Debezium
}

func (h *Harness) newPlatform(ctx context.Context, name string, s Setup) (*Platform, error) {
	if s.Relays == 0 {
		s.Relays = 1
	}
	s.Billings, s.Shims = max(s.Billings, 1), max(s.Shims, 1)
	if s.PublishMode == "" {
		s.PublishMode = "outbox"
	}
	if s.InboxMode == "" {
		s.InboxMode = "inbox"
	}
	if s.ReconcilerTimeout == "" {
		s.ReconcilerTimeout = "5s"
	}
	relayMode := h.relayMode
	if relayMode == "" {
		relayMode = "poll"
	}
	if relayMode != "poll" {
		name += "-" + relayMode // its own databases, topics and slots
	}
	id := fmt.Sprintf("%s_%s", h.runID, strings.ReplaceAll(name, "-", "_"))
	p := &Platform{h: h, Name: name, Dir: filepath.Join(h.dir, "runs", h.runID, name),
		OrdersTopic: "prove." + id + ".orders", BillingTop: "prove." + id + ".billing",
		OrdersDB: "prove_" + id + "_orders", BillingDB: "prove_" + id + "_billing", ShimDB: "prove_" + id + "_shim"}
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		return nil, err
	}
	// Each service runs as in production: migrated by its owner role, run by
	// a runtime role without DDL, its log-based relay streaming as a
	// replication role with nothing else (package pgroles). The roles are
	// the server's, shared by every platform of the run.
	roles := map[string]pgroles.Spec{}
	for svc, db := range map[string]string{"orders": p.OrdersDB, "billing": p.BillingDB, "shim": p.ShimDB} {
		if _, err := h.stack.Admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
			return nil, fmt.Errorf("creating database %s: %w", db, err)
		}
		roles[db] = pgroles.ForService(svc, db, svc+"_owner", svc+"_app")
		if svc != "shim" { // the producers: the log-based relay's walsender role
			roles[db] = roles[db].WithReplication(svc + "_repl")
		}
		h.rolesMu.Lock()
		err := pgroles.Ensure(ctx, h.stack.PGURL("postgres", false), roles[db])
		h.rolesMu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("creating the roles of %s: %w", db, err)
		}
	}
	if err := createTopics(ctx, h.stack.Brokers(), p.OrdersTopic, p.OrdersTopic+".dlt", p.BillingTop, p.BillingTop+".dlt"); err != nil {
		return nil, err
	}
	p.BillingGroup, p.ShimGroup = id+"_billing", id+"_shim"
	var err error
	brokers := strings.Join(h.stack.Brokers(), ",")
	common := func(db string) map[string]string {
		env := map[string]string{
			"DATABASE_URL": roleURL(h.stack.PGURL(db, true), roles[db].App, db), "MIGRATE_DATABASE_URL": roleURL(h.stack.PGURL(db, true), roles[db].Owner, db),
			"KAFKA_BROKERS": brokers, "LOG_LEVEL": "info", "SHUTDOWN_GRACE": "5s",
			// Slot names are global to the cluster: one per database.
			"RELAY_MODE": relayMode, "OUTBOX_SLOT": db,
		}
		if h.opts.PublishReplicated {
			env["OUTBOX_PUBLISH_REPLICATED"] = "true"
			env["INBOX_COMMIT_REPLICATED"] = "true"
		}
		// The walsender needs REPLICATION, which the app role has not: the
		// producer's replication role, which has nothing else.
		if r := roles[db].Replication; r.Name != "" {
			env["REPLICATION_DATABASE_URL"] = roleURL(h.stack.PGURL(db, true), r, db)
		}
		return env
	}
	// Every process listens on port 0 and says where (package harness):
	// no port is picked for it, so none can be taken by another first.
	newProc := func(name string, spec harness.Spec, env map[string]string, arm func() map[string]string, scrape ...string) (*Proc, error) {
		env["ADMIN_TOKEN"] = adminToken
		hp, err := harness.New(harness.Config{Spec: spec, Name: name, Bin: h.bins[spec.Name], Env: env,
			LogPath: filepath.Join(p.Dir, name+".log")})
		if err != nil {
			return nil, err
		}
		pr := &Proc{Name: name, hp: hp, arm: arm, scrape: scrape}
		p.all = append(p.all, pr)
		return pr, nil
	}
	p.newInstance = map[string]func() (*Proc, error){
		KindRelay: func() (*Proc, error) {
			env := common(p.OrdersDB)
			env["ORDERS_TOPIC"], env["PUBLISH_MODE"] = p.OrdersTopic, s.PublishMode
			if relayMode == "debezium" {
				env["DEBEZIUM_SLOT"] = debeziumSlot(p.OrdersDB)
			}
			pr, err := newProc(fmt.Sprintf("orders-%d", len(p.Orders)+1), harness.Orders, env, s.OrdersArm, "outbox_published_total")
			if err == nil {
				p.Orders = append(p.Orders, pr)
			}
			return pr, err
		},
		// Every billing instance is one member of the platform's billing
		// consumer group and shares the inbox name and the database; so do
		// the shims in theirs. The first of each keeps its historical name.
		KindBilling: func() (*Proc, error) {
			env := common(p.BillingDB)
			env["ORDERS_TOPIC"], env["BILLING_TOPIC"], env["CONSUMER_GROUP"], env["INBOX_NAME"], env["INBOX_MODE"] =
				p.OrdersTopic, p.BillingTop, p.BillingGroup, "billing", s.InboxMode
			if relayMode == "debezium" { // the connector is orders'; billing keeps its own relay
				env["RELAY_MODE"] = "poll"
			}
			pr, err := newProc(instanceName("billing", len(p.Billings)), harness.Billing, env, s.BillingArm,
				"inbox_duplicates_total", "inbox_processed_total", "inbox_dead_lettered_total", "outbox_published_total")
			if err == nil {
				p.Billings = append(p.Billings, pr)
			}
			return pr, err
		},
		KindShim: func() (*Proc, error) {
			env := common(p.ShimDB)
			env["BILLING_TOPIC"], env["CONSUMER_GROUP"] = p.BillingTop, p.ShimGroup
			env["RECONCILER_URL"], env["RECONCILER_TIMEOUT"] = p.Recon.URL(), s.ReconcilerTimeout
			pr, err := newProc(instanceName("shim", len(p.Shims)), harness.Shim, env, s.ShimArm,
				"inbox_duplicates_total", "inbox_processed_total", "inbox_dead_lettered_total")
			if err == nil {
				p.Shims = append(p.Shims, pr)
			}
			return pr, err
		},
	}
	// The reconciler first: the shims need its address.
	if !s.NoDownstream {
		if p.Recon, err = newProc("reconciler", harness.Reconciler, map[string]string{
			"LEDGER_PATH": filepath.Join(p.Dir, "ledger.jsonl"), "LOG_LEVEL": "info",
		}, nil); err != nil {
			return nil, err
		}
		if err := p.Recon.Start(ctx); err != nil {
			p.Close()
			return nil, err
		}
	}
	var kinds []string
	for range s.Relays {
		kinds = append(kinds, KindRelay)
	}
	if !s.NoDownstream {
		for range s.Billings {
			kinds = append(kinds, KindBilling)
		}
		for range s.Shims {
			kinds = append(kinds, KindShim)
		}
	}
	for _, kind := range kinds {
		if _, err := p.newInstance[kind](); err != nil {
			p.Close()
			return nil, err
		}
	}
	p.API = p.Orders[0]
	if s.APIOnly {
		env := common(p.OrdersDB)
		env["ORDERS_TOPIC"], env["PUBLISH_MODE"], env["RELAY_ENABLED"] = p.OrdersTopic, s.PublishMode, "false"
		if p.API, err = newProc("orders-api", harness.Orders, env, nil); err != nil {
			p.Close()
			return nil, err
		}
	}
	if !s.NoDownstream {
		p.Billing, p.Shim = p.Billings[0], p.Shims[0]
	}
	// The others start side by side: each connects and migrates before it
	// listens, and the shared databases' migrations are idempotent.
	errs := make([]error, len(p.all))
	var wg sync.WaitGroup
	for i, pr := range p.all {
		if pr == p.Recon {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = pr.Start(ctx) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		p.Close()
		return nil, err
	}
	for _, pr := range p.all {
		if err := pr.WaitReady(ctx, 90*time.Second); err != nil {
			p.Close()
			return nil, err
		}
	}
	for db, pool := range map[string]**pgxpool.Pool{p.OrdersDB: &p.ordersPool, p.BillingDB: &p.billingPool, p.ShimDB: &p.shimPool} {
		if *pool, err = pgxpool.New(ctx, h.stack.PGURL(db, false)); err != nil {
			p.Close()
			return nil, err
		}
	}
	if relayMode == "debezium" {
		// After orders migrated (the publication is its migration's), before
		// any order: Debezium streams only what commits after its slot.
		if p.Connect, err = p.startDebezium(ctx, roles[p.OrdersDB].Replication); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// instanceName names the i-th instance (from 0) of a consumer: the first
// keeps the bare name the one-instance proofs always used.
func instanceName(kind string, i int) string {
	if i == 0 {
		return kind
	}
	return fmt.Sprintf("%s-%d", kind, i+1)
}

// Add starts one more instance of kind (KindRelay, KindBilling, KindShim)
// mid-run, on ports of its own, supervised and scraped like the others,
// and waits until it is ready.
func (p *Platform) Add(ctx context.Context, kind string) (*Proc, error) {
	build, ok := p.newInstance[kind]
	if !ok {
		return nil, fmt.Errorf("no instance kind %q", kind)
	}
	pr, err := build()
	if err != nil {
		return nil, err
	}
	if err := pr.Start(ctx); err != nil {
		return nil, err
	}
	return pr, pr.WaitReady(ctx, 90*time.Second)
}

// Exits sums, over every process of the platform, the lifetimes that ended
// by themselves (see Proc.Exits), and lists the last exit of each.
func (p *Platform) Exits() (n int, detail []string) {
	for _, pr := range p.all {
		e, last := pr.Exits()
		n += e
		if e > 0 {
			detail = append(detail, fmt.Sprintf("%s exited %d times (last %s)", pr.Name, e, last))
		}
	}
	return n, detail
}

// Hangs sums the graceful stops that SIGTERM did not finish within stopGrace.
func (p *Platform) Hangs() int {
	n := 0
	for _, pr := range p.all {
		n += pr.Hangs()
	}
	return n
}

// Close stops every process of the platform, then drops the replication
// slots of its databases (log-based relay modes), which would otherwise pin
// WAL and keep the databases from being dropped.
func (p *Platform) Close() {
	if p.Connect != nil {
		p.Connect.Stop()
	}
	for _, pr := range p.all {
		pr.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = waitUntil(ctx, 30*time.Second, func() bool {
		dbs := []string{p.OrdersDB, p.BillingDB}
		_, _ = p.h.stack.Admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE database = ANY($1) AND NOT active`, dbs)
		var left int
		err := p.h.stack.Admin.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = ANY($1)`, dbs).Scan(&left)
		return err == nil && left == 0
	})
	for _, pool := range []*pgxpool.Pool{p.ordersPool, p.billingPool, p.shimPool} {
		if pool != nil {
			pool.Close()
		}
	}
}

// createTopics creates topics of 6 partitions, replicated as the stack's
// cluster allows (kafkautil.ReplicationFor: 3 copies and min ISR 2 on the
// three brokers of NEMESIS_TOPOLOGY=ha, 1 and 1 on one), and waits until
// they are usable.
func createTopics(ctx context.Context, brokers []string, topics ...string) error {
	if _, err := kafkautil.EnsureTopics(ctx, kafkautil.Security{}, brokers, kafkautil.TopicSpec{Partitions: 6}, topics...); err != nil {
		return err
	}
	// The services start right after: wait until every partition's leader
	// serves it, or their first fetch gets Not Leader For Partition.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return kafkautil.WaitTopicsReady(wctx, brokers, topics...)
}

// arm returns an Arm func that arms point for the first budget starts, each
// time on a random pass between 1 and maxAfter, and nothing after.
func arm(point string, budget, maxAfter int) func() map[string]string {
	var mu sync.Mutex
	armed := 0
	return func() map[string]string {
		mu.Lock()
		defer mu.Unlock()
		if armed >= budget {
			return map[string]string{"CRASH_POINT": "none", "CRASH_AFTER": "1"}
		}
		armed++
		return map[string]string{"CRASH_POINT": point, "CRASH_AFTER": strconv.Itoa(1 + rand.IntN(maxAfter))}
	}
}

// groupLag is how many messages of topic the consumer group has not
// committed yet (a group that committed nothing lags by the whole topic).
func groupLag(ctx context.Context, brokers []string, group, topic string) (int64, error) {
	behind, err := groupBehind(ctx, brokers, group, topic)
	if err != nil {
		return 0, err
	}
	var lag int64
	for _, n := range behind {
		lag += n
	}
	return lag, nil
}

// groupBehind is, per partition of topic, its end offset (ListOffsets)
// minus the group's committed offset (OffsetFetch; nothing committed counts
// as 0): zero everywhere means the group committed every message.
func groupBehind(ctx context.Context, brokers []string, group, topic string) (map[int]int64, error) {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	ends, err := topicEnds(ctx, client, topic)
	if err != nil {
		return nil, err
	}
	parts := make([]int, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	resp, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return nil, err
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	committed := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		committed[p.Partition] = p.CommittedOffset
	}
	behind := map[int]int64{}
	for p, end := range ends {
		behind[p] = end - max(committed[p], 0)
	}
	return behind, nil
}

// topicEnds returns each partition's end offset (the next offset to write).
func topicEnds(ctx context.Context, client *kafka.Client, topic string) (map[int]int64, error) {
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, err
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		return nil, fmt.Errorf("topic %s: no metadata", topic)
	}
	parts := make([]int, len(md.Topics[0].Partitions))
	for i, p := range md.Topics[0].Partitions {
		parts[i] = p.ID
	}
	return kafkautil.EndOffsets(ctx, client, topic, parts)
}

// readTopic reads every message of topic up to its current end.
func readTopic(ctx context.Context, brokers []string, topic string) ([]kafka.Message, error) {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	ends, err := topicEnds(ctx, client, topic)
	if err != nil {
		return nil, err
	}
	return kafkautil.ReadRange(ctx, brokers, topic, nil, ends, 0, 60*time.Second)
}

// roleURL is base (a URL PGURL made) as role l; base is well formed.
func roleURL(base string, l pgroles.Login, db string) string {
	u, _ := pgroles.URL(base, l, db)
	return u
}
