package reconcile_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/pgutil"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/billing"
	"github.com/onceflow/onceflow/services/orders"
	shim "github.com/onceflow/onceflow/services/reconciler-shim"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
	"github.com/onceflow/onceflow/tools/reconcile"
)

// platform is the three databases, migrated as the services migrate them,
// and a real third-party ledger. seed* are superuser pools for making
// inconsistencies; src reads with read-only roles, as the command does.
type platform struct {
	orders, billing, shim *pgxpool.Pool
	ledger                *thirdparty.Client
	src                   reconcile.Sources
	// env is the command's environment for these sources (read-only roles).
	env map[string]string
}

func newPlatform(t *testing.T) *platform {
	t.Helper()
	p := &platform{env: map[string]string{}}
	migrate := func(service string, sets ...pgutil.Migration) (*pgxpool.Pool, *pgxpool.Pool) {
		db := testinfra.NewDatabase(t)
		roles := pgrolestest.Ensure(t, db, service, "ro")
		owner := testinfra.NewPool(t, roles.OwnerURL)
		if err := pgutil.Migrate(owner, sets...); err != nil {
			t.Fatalf("migrating %s: %v", service, err)
		}
		p.env["ONCEFLOW_RECONCILE_"+strings.ToUpper(service)+"_URL"] = roles.ReaderURLs[0]
		return testinfra.NewPool(t, db), testinfra.NewPool(t, roles.ReaderURLs[0])
	}
	var roOrders, roBilling, roShim *pgxpool.Pool
	p.orders, roOrders = migrate("orders", orders.Schema...)
	p.billing, roBilling = migrate("billing", billing.Schema...)
	p.shim, roShim = migrate("shim", shim.Schema...)

	ledger, err := thirdparty.OpenLedger(filepath.Join(t.TempDir(), "ledger.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	servers, err := thirdparty.NewServer(ledger, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), thirdparty.AdminOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(servers.Public)
	t.Cleanup(srv.Close)
	p.ledger = thirdparty.NewClient(srv.URL, nil)
	p.src = reconcile.Sources{Orders: roOrders, Billing: roBilling, Shim: roShim, LedgerURL: srv.URL}
	p.env["ONCEFLOW_LEDGER_URL"] = srv.URL
	return p
}

func (p *platform) exec(t *testing.T, db *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// settledOrder is an order that went all the way: charged, forwarded, booked.
func (p *platform) settledOrder(t *testing.T, age time.Duration) uuid.UUID {
	t.Helper()
	id := p.order(t, age)
	p.charge(t, id, age)
	p.forward(t, id)
	if _, err := p.ledger.Settle(context.Background(), uuid.NewString(), thirdparty.SettleRequest{
		PaymentID: uuid.NewString(), OrderID: id.String(), Kind: thirdparty.KindCapture, AmountCents: 100, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	return id
}

func (p *platform) order(t *testing.T, age time.Duration) uuid.UUID {
	id := uuid.New()
	p.exec(t, p.orders, `INSERT INTO orders (id, customer_id, amount_cents, currency, status, version, created_at)
		VALUES ($1, 'c', 100, 'EUR', 'placed', 1, now() - $2::interval)`, id, age.String())
	return id
}

func (p *platform) charge(t *testing.T, orderID uuid.UUID, age time.Duration) {
	p.exec(t, p.billing, `INSERT INTO charges (order_id, payment_id, customer_id, amount_cents, currency, status, version, captured_at)
		VALUES ($1, $2, 'c', 100, 'EUR', 'captured', 1, now() - $3::interval)`, orderID, uuid.New(), age.String())
}

func (p *platform) forward(t *testing.T, orderID uuid.UUID) {
	p.exec(t, p.shim, `INSERT INTO forwards (event_id, event_type, order_id, kind, outcome) VALUES ($1, 'PaymentCaptured', $2, 'capture', 'sent')`,
		uuid.New(), orderID)
}

func (p *platform) outboxRow(t *testing.T, db *pgxpool.Pool, state string, age time.Duration) uuid.UUID {
	_, id := outboxtest.Seed(t, db, outboxtest.Row{State: state, Age: age})
	return id
}

func (p *platform) inboxRow(t *testing.T, db *pgxpool.Pool, status string, age, leaseAgo time.Duration) uuid.UUID {
	return inboxtest.Seed(t, db, inboxtest.Row{Consumer: "c", Status: status, Age: age, LeaseExpiredAgo: leaseAgo})
}

// parked parks an event behind a dead one, as the inbox does.
func (p *platform) parked(t *testing.T, db *pgxpool.Pool) uuid.UUID {
	id := uuid.New()
	p.exec(t, db, `INSERT INTO inbox_parked_messages (consumer, message_id, aggregate_type, aggregate_id, aggregate_version,
		event_type, blocked_by, topic, kafka_partition, kafka_offset, msg_key, msg_value, parked_at)
		VALUES ('c', $1, 'payment', 'p-1', 2, 'PaymentRefunded', $2, 'billing.events', 0, 9, 'p-1', '{}', now() - interval '1 minute')`,
		id, uuid.New())
	return id
}

// Each inconsistency made on purpose is reported once, under its kind, with
// its id; what is merely recent is not; a clean platform reports nothing.
func TestReportFindsEachInconsistencyAndNothingElse(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := newPlatform(t)

	// Clean: settled orders, published and processed rows, and things too
	// young to be late yet.
	p.settledOrder(t, time.Hour)
	p.settledOrder(t, 20*time.Minute)
	p.order(t, time.Minute)                                      // billing has 10 minutes
	p.outboxRow(t, p.orders, "pending", 10*time.Second)          // the relay has 5 minutes
	p.outboxRow(t, p.orders, "published", time.Hour)             // done
	p.inboxRow(t, p.shim, "leased", time.Minute, -time.Minute)   // lease still running
	p.inboxRow(t, p.billing, "dead_lettered", 10*time.Minute, 0) // within its SLA
	p.inboxRow(t, p.billing, "processed", 2*time.Hour, 0)
	rep, err := reconcile.Run(ctx, p.src, reconcile.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Problems(); len(got) != 0 {
		t.Fatalf("clean platform: got findings %+v", got)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.HasPrefix(text.String(), "nothing to reconcile") {
		t.Fatalf("clean report text = %q, %v", text.String(), err)
	}

	// One of each, made on purpose.
	want := map[string]string{ // kind/service -> sample id
		"outbox_stuck/orders":                 p.outboxRow(t, p.orders, "pending", 10*time.Minute).String(),
		"outbox_dead/billing":                 p.outboxRow(t, p.billing, "dead", time.Minute).String(),
		"inbox_lease_expired/reconciler-shim": p.inboxRow(t, p.shim, "leased", 10*time.Minute, 5*time.Minute).String(),
		"inbox_uncertain/reconciler-shim":     p.inboxRow(t, p.shim, "uncertain", 3*time.Minute, 0).String(),
		"dead_letter_overdue/billing":         p.inboxRow(t, p.billing, "dead_lettered", 2*time.Hour, 0).String(),
		"order_without_charge/billing":        p.order(t, 30*time.Minute).String(),
		"inbox_parked/reconciler-shim":        p.parked(t, p.shim).String(),
	}
	unforwarded := p.order(t, 40*time.Minute)
	p.charge(t, unforwarded, 30*time.Minute)
	want["charge_not_forwarded/reconciler-shim"] = unforwarded.String()
	unbooked := p.order(t, 40*time.Minute)
	p.charge(t, unbooked, 30*time.Minute)
	p.forward(t, unbooked)
	want["charge_not_settled/reconciler"] = unbooked.String()

	rep, err = reconcile.Run(ctx, p.src, reconcile.Config{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]reconcile.Finding{}
	for _, f := range rep.Problems() {
		got[f.Kind+"/"+f.Component] = f
	}
	for key, id := range want {
		f, ok := got[key]
		if !ok {
			t.Errorf("%s: not reported", key)
			continue
		}
		if f.Count != 1 || len(f.Samples) != 1 || f.Samples[0] != id || f.OldestAge <= 0 || f.Runbook == "" {
			t.Errorf("%s: got %+v, want count 1, sample %s, an age and a runbook line", key, f, id)
		}
	}
	for key := range got {
		if _, ok := want[key]; !ok {
			t.Errorf("%s: reported, but nothing of that kind was made: %+v", key, got[key])
		}
	}

	// The text names every kind with its runbook; the JSON round-trips.
	text.Reset()
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("the report:\n%s", text.String())
	for key := range want {
		kind, _, _ := strings.Cut(key, "/")
		if !strings.Contains(text.String(), kind+": "+reconcile.Runbooks[kind]) {
			t.Errorf("the text report lacks the runbook line of %s:\n%s", kind, text.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back reconcile.Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Findings) != len(rep.Findings) {
		t.Fatalf("JSON report does not decode back: %v\n%s", err, js.String())
	}

	// The gauges the alerts read.
	reg := prometheus.NewRegistry()
	m := reconcile.NewMetrics(reg)
	m.Observe(rep)
	if n := testutil.ToFloat64(gauge(t, reg, "reconcile_findings", "outbox_stuck", "orders")); n != 1 {
		t.Fatalf("reconcile_findings{kind=outbox_stuck,component=orders} = %v, want 1", n)
	}
	if n := testutil.ToFloat64(gauge(t, reg, "reconcile_findings", "outbox_stuck", "billing")); n != 0 {
		t.Fatalf("reconcile_findings{kind=outbox_stuck,component=billing} = %v, want 0", n)
	}
}

// A source that cannot be read fails the run instead of reporting it clean.
func TestUnreadableSourceFailsTheRun(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	src := p.src
	src.LedgerURL = "http://127.0.0.1:1"
	if _, err := reconcile.Run(context.Background(), src, reconcile.Config{}); err == nil || !strings.Contains(err.Error(), "ledger") {
		t.Fatalf("err = %v, want one about the ledger", err)
	}
}

// gauge returns the collector of one labelled sample, for testutil.
func gauge(t *testing.T, reg *prometheus.Registry, name, kind, service string) prometheus.Collector {
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
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["kind"] == kind && labels["component"] == service {
				return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x"}, func() float64 { return m.GetGauge().GetValue() })
			}
		}
	}
	t.Fatalf("no %s{kind=%q,component=%q}", name, kind, service)
	return nil
}

// A source that is not the service's database (no tables) fails the run with
// ErrNotMigrated rather than reading as clean, and a source that cannot be
// reached fails it with ErrUnavailable; neither shows pgx's errors as the
// reason.
func TestNamedErrorsOfTheSources(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)

	wrong := p.src
	wrong.Billing = testinfra.NewPool(t, testinfra.NewDatabase(t))
	_, err := reconcile.Run(ctx, wrong, reconcile.Config{})
	if !errors.Is(err, reconcile.ErrNotMigrated) || errors.Is(err, reconcile.ErrUnavailable) {
		t.Fatalf("an empty database as billing: %v, want ErrNotMigrated", err)
	}

	url, proxy := testinfra.ProxyDatabase(t, testinfra.NewMigratedDatabase(t, shim.Schema...))
	away := p.src
	away.Shim = testinfra.NewPool(t, url)
	proxy.Cut()
	_, err = reconcile.Run(ctx, away, reconcile.Config{})
	if !errors.Is(err, reconcile.ErrUnavailable) || !strings.Contains(err.Error(), "reconciler-shim") {
		t.Fatalf("the shim's database away: %v, want ErrUnavailable naming the component", err)
	}
}

// A one-shot report with findings exits non-zero (make reconcile, scripts)
// after printing them; a clean one exits 0; -exit-zero keeps 0 for scripts
// that read the JSON themselves.
func TestCommandFailsWhenTheReportHasFindings(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newPlatform(t)
	command := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := reconcile.Command(ctx, "reconcile", args, func(k string) string { return p.env[k] }, &out)
		return out.String(), err
	}
	p.settledOrder(t, time.Hour)
	if out, err := command(); err != nil || !strings.HasPrefix(out, "nothing to reconcile") {
		t.Fatalf("clean platform: %v\n%s", err, out)
	}
	id := p.order(t, 30*time.Minute)
	out, err := command()
	if !errors.Is(err, reconcile.ErrFindings) || !strings.Contains(out, id.String()) {
		t.Fatalf("with an order without charge: err = %v, want ErrFindings after the report:\n%s", err, out)
	}
	if out, err := command("-o", "json", "-exit-zero"); err != nil || !strings.Contains(out, id.String()) {
		t.Fatalf("-exit-zero: %v\n%s", err, out)
	}
}
