package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/inboxhttp"
	"github.com/onceflow/onceflow/platform/outboxhttp"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/pgutil"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/billing"
	"github.com/onceflow/onceflow/services/orders"
	shim "github.com/onceflow/onceflow/services/reconciler-shim"
	"github.com/onceflow/onceflow/tools/reconcile"
)

// runbookCommand matches an onceflowctl command inside a runbook line: the
// tool, its command words, then flags and their values or <placeholders>,
// up to the punctuation that ends the sentence.
var runbookCommand = regexp.MustCompile(`onceflowctl(?: [a-z][a-z-]*)+(?: (?:-[a-z][a-z-]*|<[^>]+>|[a-z0-9][a-z0-9,_.-]*[a-z0-9]))*`)

// runbookCommands returns the onceflowctl commands a runbook line tells the
// operator to run, in order.
func runbookCommands(line string) []string {
	return runbookCommand.FindAllString(line, -1)
}

// fill puts a finding's values in a runbook command's placeholders and
// splits it into arguments (without the program's name).
func fill(t *testing.T, cmd string, f reconcile.Finding) []string {
	t.Helper()
	var args []string
	for _, w := range strings.Fields(strings.TrimPrefix(cmd, "onceflowctl ")) {
		switch {
		case w == "<component>":
			w = f.Component
		case strings.HasPrefix(w, "<") && strings.HasSuffix(w, ">"):
			if len(f.Samples) == 0 {
				t.Fatalf("%s: %q has a placeholder %s and the finding no sample", f.Kind, cmd, w)
			}
			w = f.Samples[0]
		}
		args = append(args, w)
	}
	// Placeholders of two words ("<event id>") were split: join them back.
	var out []string
	for i := 0; i < len(args); i++ {
		if strings.HasPrefix(args[i], "<") && i+1 < len(args) && strings.HasSuffix(args[i+1], ">") {
			if len(f.Samples) == 0 {
				t.Fatalf("%s: %q has a placeholder and the finding no sample", f.Kind, cmd)
			}
			out = append(out, f.Samples[0])
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// runbookPlatform is the three databases migrated as the services migrate
// them (read by the report as reconcile_ro, as the dev stack does), and the
// operator listeners of orders and billing as the services mount them: the
// real outboxhttp and inboxhttp handlers behind the bearer token, billing's
// dead letters in a real Kafka dead-letter topic.
type runbookPlatform struct {
	orders, billing *pgxpool.Pool
	// requeued receives what billing's requeue sends back to its topic.
	requeued *outboxtest.Writer
	env      map[string]string
}

func newRunbookPlatform(t *testing.T) *runbookPlatform {
	t.Helper()
	p := &runbookPlatform{requeued: &outboxtest.Writer{}, env: map[string]string{"ADMIN_TOKEN": token, "ONCEFLOW_LEDGER_URL": "none"}}
	migrate := func(service string, sets ...pgutil.Migration) *pgxpool.Pool {
		db := testinfra.NewDatabase(t)
		roles := pgrolestest.Ensure(t, db, service, "ro")
		if err := pgutil.Migrate(testinfra.NewPool(t, roles.OwnerURL), sets...); err != nil {
			t.Fatalf("migrating %s: %v", service, err)
		}
		p.env["ONCEFLOW_RECONCILE_"+strings.ToUpper(service)+"_URL"] = roles.ReaderURLs[0]
		return testinfra.NewPool(t, db)
	}
	p.orders = migrate("orders", orders.Schema...)
	p.billing = migrate("billing", billing.Schema...)
	migrate("shim", shim.Schema...)

	brokers := testinfra.KafkaBrokers(t)
	input := testinfra.Name("runbook")
	testinfra.NewTopicNamed(t, brokers, input+".dlt", 1)
	p.env["ORDERS_TOPIC"] = input
	p.env["KAFKA_BROKERS"] = strings.Join(brokers, ",")

	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	admin := func(name string, mount func(e *echo.Echo)) {
		e := httpserver.NewAdmin(httpserver.AdminConfig{Logger: logger, Gatherer: prometheus.NewRegistry(), Token: token})
		mount(e)
		srv := httptest.NewServer(e)
		t.Cleanup(srv.Close)
		p.env["ONCEFLOW_"+name+"_ADMIN"] = srv.URL
	}
	admin("ORDERS", func(e *echo.Echo) {
		e.Any("/admin/outbox/*", echo.WrapHandler(http.StripPrefix("/admin/outbox", outboxhttp.Handler(p.orders, outbox.ModePoll, logger))))
	})
	admin("BILLING", func(e *echo.Echo) {
		e.Any("/admin/outbox/*", echo.WrapHandler(http.StripPrefix("/admin/outbox", outboxhttp.Handler(p.billing, outbox.ModePoll, logger))))
		e.Any("/admin/inbox/*", echo.WrapHandler(http.StripPrefix("/admin/inbox",
			inboxhttp.Handler(p.billing, p.requeued, brokers, map[string]string{input: input + ".dlt"}, logger))))
	})
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	p.env["ONCEFLOW_SHIM_ADMIN"] = down.URL
	p.env["ONCEFLOW_RECONCILER_ADMIN"] = "none"
	return p
}

// report runs `onceflowctl -o json reconcile` as the runbook says, with a
// dead-letter SLA of a millisecond so that a fresh dead letter is overdue.
func (p *runbookPlatform) report(t *testing.T) map[string]reconcile.Finding {
	t.Helper()
	out, err := ctl(t, p.env, "-o", "json", "reconcile", "-dead-letter-sla", "1ms")
	if err != nil && !errors.Is(err, reconcile.ErrFindings) {
		t.Fatalf("onceflowctl reconcile: %v\n%s", err, out)
	}
	var rep reconcile.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("onceflowctl -o json reconcile: %v\n%s", err, out)
	}
	found := map[string]reconcile.Finding{}
	for _, f := range rep.Problems() {
		found[f.Kind+"/"+f.Component] = f
	}
	return found
}

// Each reconciliation runbook that names operator actions is followed to
// the letter: its onceflowctl commands, filled with the finding's own
// component and sample id, run against the real operator handlers, and the
// finding is gone afterwards (once the relay or the consumer did the rest).
// docs/reconciliation.md shows the same commands under the kind's heading.
func TestReconciliationRunbooksResolveTheirFindings(t *testing.T) {
	t.Parallel()
	p := newRunbookPlatform(t)

	// An outbox row of orders the relay gave up on.
	_, deadEvent := outboxtest.Seed(t, p.orders, outboxtest.Row{State: "dead", Age: time.Hour, LastError: "broker refused: too large"})
	// A message billing's consumer refused, in its dead-letter topic.
	poison := event.Envelope{EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
		AggregateID: uuid.New().String(), AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`)}
	cfg := inbox.Config{Name: "billing", DeadLetterTopic: p.env["ORDERS_TOPIC"] + ".dlt"}
	refuse := func(context.Context, pgx.Tx, event.Envelope) error {
		return inbox.Permanent(errors.New("no such customer"))
	}
	dlts := inboxtest.Deliver(t, p.billing, cfg, refuse, poison)
	if len(dlts) != 1 {
		t.Fatalf("the refused message gave %d dead letters, want 1", len(dlts))
	}
	w := &kafka.Writer{Addr: kafka.TCP(testinfra.KafkaBrokers(t)...), RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, dlts...); err != nil {
		t.Fatalf("writing the dead letter to Kafka: %v", err)
	}

	found := p.report(t)
	doc, err := os.ReadFile("../../../docs/reconciliation.md")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		key     string
		sample  string
		resolve func(t *testing.T)
	}{
		{reconcile.KindOutboxDead + "/orders", deadEvent.String(), func(t *testing.T) {
			// The relay publishes what the requeue set back to pending.
			var pub outboxtest.Writer
			relay, err := outbox.NewRelay(p.orders, &pub, outbox.RelayConfig{})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); _ = relay.Run(runCtx) }()
			defer func() { stop(); wg.Wait() }()
			testinfra.WaitFor(t, 30*time.Second, "the relay to publish the requeued event", func() (bool, error) {
				for _, ev := range outboxtest.Enqueued(t, p.orders, outboxtest.Match{State: "published"}) {
					if ev.EventID == deadEvent {
						return true, nil
					}
				}
				return false, nil
			})
		}},
		{reconcile.KindDeadLetterOverdue + "/billing", poison.EventID.String(), func(t *testing.T) {
			// The consumer takes the requeued message again; the cause
			// (the customer) is fixed, so it is processed this time.
			evs := p.requeued.Events(t)
			if len(evs) != 1 || evs[0].EventID != poison.EventID {
				t.Fatalf("requeued %v, want the dead letter's event %s", evs, poison.EventID)
			}
			accept := func(context.Context, pgx.Tx, event.Envelope) error { return nil }
			if dl := inboxtest.Deliver(t, p.billing, inbox.Config{Name: "billing"}, accept, evs...); len(dl) != 0 {
				t.Fatalf("the requeued event was dead-lettered again: %v", dl)
			}
			inboxtest.RequireProcessed(t, p.billing, "billing", poison.EventID)
		}},
	}
	for _, c := range cases {
		f, ok := found[c.key]
		if !ok || len(f.Samples) == 0 || f.Samples[0] != c.sample {
			t.Fatalf("%s: the report has %+v, want the seeded %s (report: %+v)", c.key, f, c.sample, found)
		}
		cmds := runbookCommands(f.Runbook)
		if len(cmds) == 0 {
			t.Fatalf("%s: the runbook line names no onceflowctl command: %q", c.key, f.Runbook)
		}
		section := docSection(string(doc), "### `"+f.Kind+"`")
		for _, cmd := range cmds {
			if !strings.Contains(section, cmd) {
				t.Errorf("%s: docs/reconciliation.md's section does not show %q, which the report prints", f.Kind, cmd)
			}
			args := fill(t, cmd, f)
			out, err := ctl(t, p.env, args...)
			if err != nil {
				t.Fatalf("%s: the runbook's `onceflowctl %s` failed: %v\n%s", c.key, strings.Join(args, " "), err, out)
			}
			t.Logf("%s: onceflowctl %s\n%s", c.key, strings.Join(args, " "), out)
			if strings.Contains(cmd, " list") && !strings.Contains(out, c.sample) {
				t.Errorf("%s: `onceflowctl %s` does not show the finding's id %s:\n%s", c.key, strings.Join(args, " "), c.sample, out)
			}
		}
		c.resolve(t)
	}
	after := p.report(t)
	for _, c := range cases {
		if f, ok := after[c.key]; ok {
			t.Errorf("%s is still reported after its runbook: %+v", c.key, f)
		}
	}
	if len(after) != 0 {
		t.Errorf("after the runbooks the report still finds %+v", after)
	}
}

// docSection is the text under heading, up to the next heading.
func docSection(doc, heading string) string {
	i := strings.Index(doc, heading+"\n")
	if i < 0 {
		return ""
	}
	rest := doc[i+len(heading)+1:]
	if j := strings.Index(rest, "\n#"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}
