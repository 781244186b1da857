package onceflow

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"go.k6.io/k6/js/modules"
)

// Config says where the platform under test keeps its state. Scripts pass
// it as a plain object: onceflow.connect({ordersDB: …, shimDB: …, …}).
type Config struct {
	// OrdersDB, BillingDB and ShimDB are the services' Postgres URLs.
	OrdersDB  string `js:"ordersDB"`
	BillingDB string `js:"billingDB"`
	ShimDB    string `js:"shimDB"`
	// Brokers is a comma-separated list of Kafka bootstrap brokers; needed
	// only by the produce functions.
	Brokers string `js:"brokers"`
	// OrdersTopic is where orders publishes (duplicate and poison target).
	OrdersTopic string `js:"ordersTopic"`
}

func (c Config) key() string {
	return strings.Join([]string{c.OrdersDB, c.BillingDB, c.ShimDB, c.Brokers, c.OrdersTopic}, "\x00")
}

// shared is one platform's connections and the run's order tracker.
type shared struct {
	cfg                Config
	orders, bill, shim *pgxpool.Pool
	writer             *kafka.Writer // nil without Brokers
	tracker            *tracker
}

// clients holds the shared connections per Config, for the process.
type clients struct {
	mu sync.Mutex
	m  map[string]*shared
}

func newClients() *clients { return &clients{m: map[string]*shared{}} }

func (cs *clients) get(ctx context.Context, cfg Config) (*shared, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if s, ok := cs.m[cfg.key()]; ok {
		return s, nil
	}
	if cfg.OrdersDB == "" || cfg.BillingDB == "" || cfg.ShimDB == "" {
		return nil, errors.New("onceflow.connect needs ordersDB, billingDB and shimDB")
	}
	// The pools outlive any one VU's context: they serve the whole run.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	s := &shared{cfg: cfg, tracker: newTracker()}
	for _, p := range []struct {
		url  string
		into **pgxpool.Pool
	}{{cfg.OrdersDB, &s.orders}, {cfg.BillingDB, &s.bill}, {cfg.ShimDB, &s.shim}} {
		pc, err := pgxpool.ParseConfig(p.url)
		if err != nil {
			return nil, fmt.Errorf("onceflow: %w", err)
		}
		// The probe and the audit need a connection or two; the platform
		// under test should get the database's attention, not the observer.
		pc.MaxConns = 2
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err == nil {
			err = pool.Ping(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("onceflow: connecting to %s: %w", redact(p.url), err)
		}
		*p.into = pool
	}
	if cfg.Brokers != "" {
		s.writer = &kafka.Writer{
			Addr: kafka.TCP(strings.Split(cfg.Brokers, ",")...),
			// The relays' balancer (kafkautil.NewWriter: murmur2, as Kafka's Java
			// client): a redelivery lands on its original partition.
			Balancer:     &kafka.Murmur2Balancer{},
			RequiredAcks: kafka.RequireAll,
			BatchTimeout: time.Millisecond,
		}
	}
	cs.m[cfg.key()] = s
	return s, nil
}

// redact drops the password from a Postgres URL for error messages.
func redact(url string) string {
	if at := strings.LastIndex(url, "@"); at > 0 {
		if scheme := strings.Index(url, "://"); scheme >= 0 && scheme < at {
			return url[:scheme+3] + "…" + url[at:]
		}
	}
	return url
}

// Client is what onceflow.connect returns to a VU.
type Client struct {
	shared *shared
	vu     modules.VU
}

func (c *Client) ctx() context.Context {
	if ctx := c.vu.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
