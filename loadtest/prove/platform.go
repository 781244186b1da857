package prove

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
	"github.com/onceflow/onceflow/pkg/platform/pgroles"
)

// Setup says which processes a proof runs and how.
type Setup struct {
	// PublishMode and InboxMode are the services' modes (outbox/naive, inbox/naive).
	PublishMode, InboxMode string
	// Relays is the number of orders processes (each runs a relay). Default 1.
	Relays int
	// APIOnly adds an orders process without a relay, which the driver uses.
	APIOnly bool
	// NoDownstream runs no billing, shim or reconciler (ordering).
	NoDownstream bool
	// Arm functions give the extra environment of each (re)start.
	OrdersArm, BillingArm, ShimArm func() map[string]string
	// ReconcilerTimeout is the shim's RECONCILER_TIMEOUT. Default 5s.
	ReconcilerTimeout string
}

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
	Billing, Shim, Recon    *Proc
	ordersPool, billingPool *pgxpool.Pool
	shimPool                *pgxpool.Pool
	all                     []*Proc
}

func (h *Harness) newPlatform(ctx context.Context, name string, s Setup) (*Platform, error) {
	if s.Relays == 0 {
		s.Relays = 1
	}
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
	// a runtime role without DDL (package pgroles). The roles are the
	// server's, shared by every platform of the run.
	roles := map[string]pgroles.Spec{}
	for svc, db := range map[string]string{"orders": p.OrdersDB, "billing": p.BillingDB, "shim": p.ShimDB} {
		if _, err := h.stack.Admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
			return nil, fmt.Errorf("creating database %s: %w", db, err)
		}
		roles[db] = pgroles.ForService(svc, db, svc+"_owner", svc+"_app")
		if err := pgroles.Ensure(ctx, h.stack.PGURL("postgres", false), roles[db]); err != nil {
			return nil, fmt.Errorf("creating the roles of %s: %w", db, err)
		}
	}
	if err := createTopics(ctx, h.stack.Brokers(), p.OrdersTopic, p.OrdersTopic+".dlt", p.BillingTop, p.BillingTop+".dlt"); err != nil {
		return nil, err
	}
	// One call, so the operator ports cannot repeat a public one.
	ports, err := freePorts(2 * (s.Relays + 4))
	if err != nil {
		return nil, err
	}
	ports, adminPorts := ports[:s.Relays+4], ports[s.Relays+4:]
	adminPortOf := map[int]int{}
	for i, port := range ports {
		adminPortOf[port] = adminPorts[i]
	}
	brokers := strings.Join(h.stack.Brokers(), ",")
	common := func(port int, db string) map[string]string {
		return map[string]string{
			"HTTP_ADDR":    fmt.Sprintf("127.0.0.1:%d", port),
			"DATABASE_URL": roleURL(h.stack.PGURL(db, true), roles[db].App, db), "MIGRATE_DATABASE_URL": roleURL(h.stack.PGURL(db, true), roles[db].Owner, db),
			"KAFKA_BROKERS": brokers, "LOG_LEVEL": "info", "SHUTDOWN_GRACE": "5s",
			// Slot names are global to the cluster: one per database. The
			// walsender needs REPLICATION, which the app role has not: the
			// stack's superuser, as a deployment's replication role would be.
			"RELAY_MODE": relayMode, "OUTBOX_SLOT": db, "REPLICATION_DATABASE_URL": h.stack.PGURL(db, true),
		}
	}
	newProc := func(name, bin string, port int, env map[string]string, arm func() map[string]string, scrape ...string) *Proc {
		env["ADMIN_ADDR"], env["ADMIN_TOKEN"] = fmt.Sprintf("127.0.0.1:%d", adminPortOf[port]), adminToken
		pr := &Proc{Name: name, Port: port, AdminPort: adminPortOf[port], bin: h.bins[bin], env: env, arm: arm, scrape: scrape,
			log: filepath.Join(p.Dir, name+".log")}
		p.all = append(p.all, pr)
		return pr
	}
	for i := range s.Relays {
		env := common(ports[i], p.OrdersDB)
		env["ORDERS_TOPIC"], env["PUBLISH_MODE"] = p.OrdersTopic, s.PublishMode
		p.Orders = append(p.Orders, newProc(fmt.Sprintf("orders-%d", i+1), "orders", ports[i], env, s.OrdersArm,
			"outbox_published_total"))
	}
	p.API = p.Orders[0]
	if s.APIOnly {
		env := common(ports[s.Relays], p.OrdersDB)
		env["ORDERS_TOPIC"], env["PUBLISH_MODE"], env["RELAY_ENABLED"] = p.OrdersTopic, s.PublishMode, "false"
		p.API = newProc("orders-api", "orders", ports[s.Relays], env, nil)
	}
	if !s.NoDownstream {
		reconPort := ports[s.Relays+1]
		p.Recon = newProc("reconciler", "reconciler", reconPort, map[string]string{
			"HTTP_ADDR": fmt.Sprintf("127.0.0.1:%d", reconPort), "LEDGER_PATH": filepath.Join(p.Dir, "ledger.jsonl"), "LOG_LEVEL": "info",
		}, nil)
		env := common(ports[s.Relays+2], p.BillingDB)
		env["ORDERS_TOPIC"], env["BILLING_TOPIC"], env["CONSUMER_GROUP"], env["INBOX_NAME"], env["INBOX_MODE"] =
			p.OrdersTopic, p.BillingTop, "billing", "billing", s.InboxMode
		p.Billing = newProc("billing", "billing", ports[s.Relays+2], env, s.BillingArm,
			"inbox_duplicates_total", "inbox_processed_total", "inbox_dead_lettered_total")
		env = common(ports[s.Relays+3], p.ShimDB)
		env["BILLING_TOPIC"], env["CONSUMER_GROUP"] = p.BillingTop, "shim"
		env["RECONCILER_URL"], env["RECONCILER_TIMEOUT"] = p.Recon.URL(), s.ReconcilerTimeout
		p.Shim = newProc("shim", "shim", ports[s.Relays+3], env, s.ShimArm,
			"inbox_duplicates_total", "inbox_processed_total", "inbox_dead_lettered_total")
	}
	for _, pr := range p.all {
		if err := pr.Start(); err != nil {
			p.Close()
			return nil, err
		}
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
	return p, nil
}

// Close stops every process of the platform, then drops the replication
// slots of its databases (log-based relay modes), which would otherwise pin
// WAL and keep the databases from being dropped.
func (p *Platform) Close() {
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

// createTopics creates topics of 6 partitions and waits until they are usable.
func createTopics(ctx context.Context, brokers []string, topics ...string) error {
	conn, err := kafkautil.Controller(ctx, brokers)
	if err != nil {
		return err
	}
	defer conn.Close()
	cfgs := make([]kafka.TopicConfig, 0, len(topics))
	for _, t := range topics {
		cfgs = append(cfgs, kafka.TopicConfig{Topic: t, NumPartitions: 6, ReplicationFactor: 1})
	}
	if err := conn.CreateTopics(cfgs...); err != nil {
		return fmt.Errorf("creating topics: %w", err)
	}
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	return waitUntil(ctx, 30*time.Second, func() bool {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		if err != nil || len(md.Topics) != len(topics) {
			return false
		}
		for _, t := range md.Topics {
			if t.Error != nil || len(t.Partitions) != 6 {
				return false
			}
			for _, pt := range t.Partitions {
				if pt.Leader.ID < 0 {
					return false
				}
			}
		}
		return true
	})
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
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	ends, err := topicEnds(ctx, client, topic)
	if err != nil {
		return 0, err
	}
	parts := make([]int, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	resp, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return 0, err
	}
	if resp.Error != nil {
		return 0, resp.Error
	}
	var lag int64
	committed := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		committed[p.Partition] = p.CommittedOffset
	}
	for p, end := range ends {
		c := committed[p]
		if c < 0 {
			c = 0
		}
		lag += end - c
	}
	return lag, nil
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
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, p := range md.Topics[0].Partitions {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p.ID))
	}
	resp, err := client.ListOffsets(ctx, req)
	if err != nil {
		return nil, err
	}
	ends := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		ends[p.Partition] = p.LastOffset
	}
	return ends, nil
}

// readTopic reads every message of topic up to its current end.
func readTopic(ctx context.Context, brokers []string, topic string) ([]kafka.Message, error) {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	ends, err := topicEnds(ctx, client, topic)
	if err != nil {
		return nil, err
	}
	var out []kafka.Message
	for p, end := range ends {
		if end == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		for {
			m, err := r.ReadMessage(rctx)
			if err != nil {
				cancel()
				r.Close()
				return nil, fmt.Errorf("reading %s/%d: %w", topic, p, err)
			}
			out = append(out, m)
			if m.Offset >= end-1 {
				break
			}
		}
		cancel()
		r.Close()
	}
	return out, nil
}

// getJSON decodes a GET's JSON body into v.
func getJSON(ctx context.Context, url string, v any) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// roleURL is base (a URL PGURL made) as role l; base is well formed.
func roleURL(base string, l pgroles.Login, db string) string {
	u, _ := pgroles.URL(base, l, db)
	return u
}
