package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/tools/journey"
)

// The dev stack's sources for journey, read as reconcile_ro (the same
// variables as reconcile's).
const (
	defaultOrdersDB  = "postgres://reconcile_ro:reconcile_ro@127.0.0.1:7432/orders?sslmode=disable"
	defaultBillingDB = "postgres://reconcile_ro:reconcile_ro@127.0.0.1:7432/billing?sslmode=disable"
	defaultShimDB    = "postgres://reconcile_ro:reconcile_ro@127.0.0.1:7432/shim?sslmode=disable"
	defaultBrokers   = "127.0.0.1:7092"
	defaultLedger    = "http://127.0.0.1:8084"
)

func (a *app) journey(ctx context.Context, args []string) error {
	fs := newFlags("journey", a.out)
	fs.Usage = func() {
		fmt.Fprint(a.out, `usage: onceflowctl [-o text|json] journey [flags] <order-id>

Every step of one order: its row, the outbox rows, the Kafka records (partition, offset,
headers, the relay that published them), the inbox rows, the charge, the forward, the
dead-letter topics and the third party's ledger, each with its time and the hop's latency,
then what is missing or odd. Reads only, as reconcile_ro.

Sources: ONCEFLOW_RECONCILE_ORDERS_URL, ONCEFLOW_RECONCILE_BILLING_URL,
ONCEFLOW_RECONCILE_SHIM_URL (default the dev stack's databases as reconcile_ro),
KAFKA_BROKERS (default 127.0.0.1:7092), ORDERS_TOPIC, BILLING_TOPIC,
ONCEFLOW_LEDGER_URL (default http://127.0.0.1:8084; "none" skips it).

flags:
`)
		fs.PrintDefaults()
	}
	scanFrom := fs.Duration("scan-from", time.Minute, "read the topics from this long before the order's first step")
	maxScan := fs.Int("max-scan", 200_000, "read at most this many records per topic")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("journey needs one order id")
	}
	env := func(key, def string) string {
		if v := a.getenv(key); v != "" {
			return v
		}
		return def
	}
	src := journey.Sources{
		Brokers:      strings.Split(env("KAFKA_BROKERS", defaultBrokers), ","),
		OrdersTopic:  env("ORDERS_TOPIC", "orders.events"),
		BillingTopic: env("BILLING_TOPIC", "billing.events"),
		LedgerURL:    env("ONCEFLOW_LEDGER_URL", defaultLedger),
		ScanFrom:     *scanFrom,
		MaxScan:      *maxScan,
	}
	if src.LedgerURL == "none" {
		src.LedgerURL = ""
	}
	for _, db := range []struct {
		set     func(*pgxpool.Pool)
		key, df string
	}{
		{func(p *pgxpool.Pool) { src.Orders = p }, "ONCEFLOW_RECONCILE_ORDERS_URL", defaultOrdersDB},
		{func(p *pgxpool.Pool) { src.Billing = p }, "ONCEFLOW_RECONCILE_BILLING_URL", defaultBillingDB},
		{func(p *pgxpool.Pool) { src.Shim = p }, "ONCEFLOW_RECONCILE_SHIM_URL", defaultShimDB},
	} {
		pool, err := pgxpool.New(ctx, env(db.key, db.df))
		if err != nil {
			return fmt.Errorf("%s: %w", db.key, err)
		}
		defer pool.Close()
		db.set(pool)
	}
	j, err := journey.Follow(ctx, src, fs.Arg(0))
	if err != nil {
		return err
	}
	if a.json {
		return a.writeJSON(j)
	}
	return j.WriteText(a.out)
}
