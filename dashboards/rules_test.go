package dashboards_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"gopkg.in/yaml.v3"
)

// promtool returns the path of promtool, failing the test with how to get it.
func promtool(t *testing.T) string {
	t.Helper()
	return tool(t, "promtool")
}

func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("this test needs %s from Debian's prometheus package: run `devstack/stack.sh prometheus-install` "+
			"(or `make test`, which does), or `apt-get install prometheus`: %v", name, err)
	}
	return p
}

func runTool(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(name), args, err, out)
	}
	return string(out)
}

func TestRuleFilesAreValid(t *testing.T) {
	files, err := filepath.Glob("alerts/*.yml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no rule files in alerts/ (%v)", err)
	}
	runTool(t, ".", promtool(t), append([]string{"check", "rules"}, files...)...)
	for _, r := range loadRules(t) {
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" || r.Annotations["runbook_url"] == "" {
			t.Errorf("alert %s needs a summary, a description and a runbook_url annotation", r.Alert)
		}
		if _, ok := r.Annotations["runbook"]; ok {
			t.Errorf("alert %s has a free-text runbook annotation: the runbook goes in docs/alerts.md, linked by runbook_url", r.Alert)
		}
		if r.Labels["severity"] != "page" && r.Labels["severity"] != "ticket" {
			t.Errorf("alert %s: severity %q, want page or ticket", r.Alert, r.Labels["severity"])
		}
	}
}

// The compose file's Prometheus configuration loads, with its rule files.
func TestPrometheusConfigIsValid(t *testing.T) {
	runTool(t, ".", promtool(t), "check", "config", "prometheus/prometheus.yml")
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// loadRules reads every alert of alerts/*.yml.
func loadRules(t *testing.T) []rule {
	t.Helper()
	files, err := filepath.Glob("alerts/*.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules []rule
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Groups []struct {
				Rules []rule `yaml:"rules"`
			} `yaml:"groups"`
		}
		if err := yaml.Unmarshal(body, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, g := range doc.Groups {
			rules = append(rules, g.Rules...)
		}
	}
	return rules
}

// The promtool unit tests of the alerts: for each alert, input series that
// must make it fire (with the labels and summary it must fire with) and
// series that must not. The description and the runbook_url are taken from
// the rule itself, so only the rendered summary and the labels are asserted
// here.

type series struct{ Series, Values string }

type firing struct {
	labels  map[string]string
	summary string
}

type check struct {
	at    string   // eval_time
	fires []firing // nil: the alert must not be firing then
}

type alertCase struct {
	alert  string
	series []series
	checks []check
}

var alertCases = []alertCase{
	{"OutboxBacklogAgeOverSLO",
		[]series{
			{`outbox_oldest_pending_age_seconds{service="orders",instance="orders:8081"}`, "0+30x10"},
			{`outbox_oldest_pending_age_seconds{service="billing",instance="billing:8082"}`, "0x10"},
		},
		[]check{
			{at: "4m"}, // over the SLO since 3m: pending, not firing yet
			{at: "5m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: the oldest unpublished outbox event is 2m 30s old (SLO 60s)"}}},
		}},
	{"OutboxRelayStalled",
		[]series{
			{`outbox_pending_events{service="orders",instance="orders:8081"}`, "5x20"},
			{`outbox_published_total{service="orders",instance="orders:8081"}`, "100x20"},
			// billing has a backlog too, but publishes: busy, not stalled.
			{`outbox_pending_events{service="billing",instance="billing:8082"}`, "5x20"},
			{`outbox_published_total{service="billing",instance="billing:8082"}`, "0+10x20"},
		},
		[]check{
			{at: "4m"},
			{at: "7m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: 5 outbox events pending and none published for 5 minutes"}}},
		}},
	{"OutboxPublishFailures",
		[]series{
			{`outbox_publish_failures_total{service="billing",instance="billing:8082"}`, "0+60x20"},
			{`outbox_publish_failures_total{service="orders",instance="orders:8081"}`, "0x20"},
		},
		[]check{
			{at: "9m"},
			{at: "12m", fires: []firing{{map[string]string{"service": "billing"},
				"billing: outbox publishes have been failing for 10 minutes (1/s)"}}},
		}},
	{"OutboxKafkaDisconnected",
		[]series{
			// One of orders' two relays lost Kafka at 2m; billing had a blip shorter than the for.
			{`outbox_kafka_connected{service="orders",instance="orders-1:8081"}`, "1 1 0 0 0 0 0"},
			{`outbox_kafka_connected{service="orders",instance="orders-2:8081"}`, "1x6"},
			{`outbox_kafka_connected{service="billing",instance="billing:8082"}`, "1 0 1 1 1 1 1"},
		},
		[]check{
			{at: "2m"}, // down since 2m: pending, not firing yet
			{at: "4m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: an outbox relay has not reached Kafka for over a minute"}}},
		}},
	{"OutboxSlotRetainingWAL",
		[]series{
			// orders' slot grows by 512 MiB a minute (its relay stopped); billing's stays small.
			{`outbox_slot_lag_bytes{service="orders",instance="orders:8081"}`, "0+536870912x10"},
			{`outbox_slot_lag_bytes{service="billing",instance="billing:8082"}`, "1048576x10"},
		},
		[]check{
			{at: "5m"}, // over 1 GiB since 3m: pending
			{at: "9m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: the outbox replication slot retains 4.5GiB of WAL"}}},
		}},
	{"OutboxExternalPublisherDown",
		[]series{
			// orders runs RELAY_MODE=debezium and its connector stopped at 1m; billing
			// runs its own relay (always 1); shipping's connector restarted within the for.
			{`outbox_external_publisher_streaming{service="orders",instance="orders:8081"}`, "1 0 0 0 0 0 0 0 0"},
			{`outbox_external_publisher_streaming{service="billing",instance="billing:8082"}`, "1x8"},
			{`outbox_external_publisher_streaming{service="shipping",instance="shipping:8083"}`, "1 0 0 1 1 1 1 1 1"},
		},
		[]check{
			{at: "4m"}, // not streaming since 1m: pending
			{at: "7m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: nobody streams from Debezium's replication slot: its outbox events are not published"}}},
		}},
	{"OutboxSlotLost",
		[]series{
			{`outbox_slot_lost_total{service="billing",instance="billing:8082"}`, "0 0 0 1 1 1"},
			{`outbox_slot_lost_total{service="orders",instance="orders:8081"}`, "0x5"},
		},
		[]check{
			{at: "2m"},
			{at: "4m", fires: []firing{{map[string]string{"service": "billing"},
				"billing: the outbox replication slot was lost and replaced"}}},
		}},
	{"OutboxPublicationMissing",
		[]series{
			// orders' stream fails on a change committed while the publication was dropped, on
			// every reconnect from 2m; billing's streams.
			{`outbox_slot_publication_missing_total{service="orders",instance="orders:8081"}`, "0 0 1 3 5 7"},
			{`outbox_slot_publication_missing_total{service="billing",instance="billing:8082"}`, "0x5"},
		},
		[]check{
			{at: "1m"},
			{at: "3m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: the outbox stream is stalled on a change committed while its publication was missing"}}},
		}},
	{"OutboxSlotNearInvalidation",
		[]series{
			// orders' slot retains 1 GiB more a minute against a 10 GiB keep size; billing's
			// keep size is unlimited (+Inf) and never fires; shipping runs no log-based relay (0/0).
			{`outbox_slot_retained_wal_bytes{service="orders",instance="orders:8081"}`, "0+1073741824x10"},
			{`outbox_slot_wal_keep_size_bytes{service="orders",instance="orders:8081"}`, "10737418240x10"},
			{`outbox_slot_retained_wal_bytes{service="billing",instance="billing:8082"}`, "0+1073741824x10"},
			{`outbox_slot_wal_keep_size_bytes{service="billing",instance="billing:8082"}`, "Inf Inf Inf Inf Inf Inf Inf Inf Inf Inf Inf"},
			{`outbox_slot_retained_wal_bytes{service="shipping",instance="shipping:8083"}`, "0x10"},
			{`outbox_slot_wal_keep_size_bytes{service="shipping",instance="shipping:8083"}`, "0x10"},
		},
		[]check{
			{at: "7m"}, // over half since 6m: pending
			{at: "8m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: the outbox replication slot retains 80% of max_slot_wal_keep_size"}}},
		}},
	{"OutboxWALOnlyEventsLost",
		[]series{
			{`outbox_slot_lost_unrecoverable_total{service="orders",instance="orders:8081"}`, "0 0 0 1 1 1"},
			{`outbox_slot_lost_unrecoverable_total{service="billing",instance="billing:8082"}`, "0x5"},
		},
		[]check{
			{at: "2m"},
			{at: "4m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: a lost replication slot lost WAL-only outbox events"}}},
		}},
	{"OutboxEmittedRefused",
		[]series{
			{`outbox_emitted_refused_total{service="billing",instance="billing:8082",reason="invalid"}`, "0 0 0 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2"},
			{`outbox_emitted_refused_total{service="billing",instance="billing:8082",reason="undecodable"}`, "0x20"},
		},
		[]check{
			{at: "2m"},
			{at: "5m", fires: []firing{{map[string]string{"service": "billing", "reason": "invalid"},
				"billing: 2 messages in the WAL under the outbox's prefix refused (invalid)"}}},
			{at: "20m"}, // none for over 10 minutes
		}},
	{"OutboxDeadEvents",
		[]series{{`outbox_dead_events{service="orders",instance="orders:8081"}`, "0 0 2 2 2 2"}},
		[]check{
			{at: "1m"},
			{at: "3m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: 2 outbox events are dead and hold back their aggregates"}}},
		}},
	{"InboxDeadLettersGrowing",
		[]series{
			{`inbox_dead_lettered_total{service="billing",consumer="billing",reason="exhausted"}`, "0 0 0 0 0 0 0 0 0 0 0 0 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2"},
			{`inbox_dead_lettered_total{service="billing",consumer="billing",reason="permanent"}`, "0x30"},
		},
		[]check{
			{at: "11m"},
			{at: "15m", fires: []firing{{map[string]string{"service": "billing", "consumer": "billing", "reason": "exhausted"},
				"billing/billing: 2 messages dead-lettered (exhausted) in 10 minutes"}}},
			{at: "30m"}, // no new ones for over 10 minutes
		}},
	{"InboxDeadLetterBacklog",
		[]series{{`inbox_dead_letters{service="reconciler-shim",consumer="reconciler-shim"}`, "3x70"}},
		[]check{
			{at: "30m"},
			{at: "65m", fires: []firing{{map[string]string{"service": "reconciler-shim", "consumer": "reconciler-shim"},
				"reconciler-shim/reconciler-shim: 3 dead letters have waited over an hour"}}},
		}},
	{"InboxHoldWithoutDeadLetter",
		[]series{{`inbox_stranded_holds{service="billing",consumer="billing"}`, "0 0 1x20"}},
		[]check{
			{at: "5m"},
			{at: "15m", fires: []firing{{map[string]string{"service": "billing", "consumer": "billing"},
				"billing/billing: 1 held aggregates have no requeueable dead letter behind them"}}},
		}},
	{"InboxDeadLetterPastRetention",
		[]series{
			{`inbox_holds_past_dead_letter_retention{service="reconciler-shim",consumer="reconciler-shim"}`, "0 0 2x20"},
			{`inbox_holds_past_dead_letter_retention{service="billing",consumer="billing"}`, "0x22"},
		},
		[]check{
			{at: "5m"},
			{at: "15m", fires: []firing{{map[string]string{"service": "reconciler-shim", "consumer": "reconciler-shim"},
				"reconciler-shim/reconciler-shim: 2 held aggregates wait for dead letters older than the dead-letter topic's retention"}}},
		}},
	{"InboxTransitionsRefused",
		[]series{
			{`inbox_transitions_refused_total{service="billing",consumer="billing",transition="dead_letter"}`, "0+5x20"},
			{`inbox_transitions_refused_total{service="billing",consumer="billing",transition="renew"}`, "0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"},
		},
		[]check{
			{at: "1m"},
			{at: "12m", fires: []firing{{map[string]string{"service": "billing", "consumer": "billing", "transition": "dead_letter"},
				"billing/billing: 50 refused dead_letter transitions in 10 minutes"}}},
		}},
	{"InboxFailures",
		[]series{
			{`inbox_failures_total{service="billing",consumer="billing"}`, "0+30x20"},
			{`inbox_failures_total{service="reconciler-shim",consumer="reconciler-shim"}`, "0x20"},
		},
		[]check{
			{at: "9m"},
			{at: "12m", fires: []firing{{map[string]string{"service": "billing", "consumer": "billing"},
				"billing/billing: the handler has been failing for 10 minutes (500m/s)"}}},
		}},
	{"ConsumerLagGrowing",
		[]series{
			{`consumer_lag_messages{service="billing",consumer="billing",topic="orders.events",partition="0"}`, "0+200x30"},
			{`consumer_lag_messages{service="billing",consumer="billing",topic="orders.events",partition="1"}`, "0+100x30"},
			// High but steady (or draining) is not growing.
			{`consumer_lag_messages{service="reconciler-shim",consumer="reconciler-shim",topic="billing.events",partition="0"}`, "5000x30"},
		},
		[]check{
			{at: "10m"}, // over 1000 since 4m
			{at: "15m", fires: []firing{{map[string]string{"service": "billing", "consumer": "billing", "topic": "orders.events"},
				"billing/billing: 4500 messages behind on orders.events, and growing"}}},
		}},
	{"InboxKafkaDisconnected",
		[]series{
			// One of billing's two consumers lost Kafka at 2m; the shim had a blip shorter than the for.
			{`inbox_kafka_connected{service="billing",consumer="billing",instance="billing-1:9082"}`, "1 1 0 0 0 0 0"},
			{`inbox_kafka_connected{service="billing",consumer="billing",instance="billing-2:9082"}`, "1x6"},
			{`inbox_kafka_connected{service="reconciler-shim",consumer="reconciler-shim",instance="shim:9083"}`, "1 0 1 1 1 1 1"},
		},
		[]check{
			{at: "2m"}, // down since 2m: pending, not firing yet
			{at: "4m", fires: []firing{{map[string]string{"service": "billing", "consumer": "billing"},
				"billing/billing: an inbox consumer has not reached Kafka for over a minute"}}},
		}},
	{"InboxDatabaseDisconnected",
		[]series{
			{`inbox_database_connected{service="reconciler-shim",consumer="reconciler-shim",instance="shim:9083"}`, "1 1 0 0 0 0 1"},
			{`inbox_database_connected{service="billing",consumer="billing",instance="billing:9082"}`, "1 0 1 1 1 1 1"},
		},
		[]check{
			{at: "2m"},
			{at: "4m", fires: []firing{{map[string]string{"service": "reconciler-shim", "consumer": "reconciler-shim"},
				"reconciler-shim/reconciler-shim: an inbox consumer has not reached its database for over a minute"}}},
			{at: "6m"}, // back
		}},
	{"InboxThirdPartyDisconnected",
		[]series{
			{`inbox_effect_connected{service="reconciler-shim",consumer="reconciler-shim",instance="shim:9083"}`, "1 0 0 0 0 0 1"},
			{`inbox_effect_connected{service="billing",consumer="billing",instance="billing:9082"}`, "1 0 1 1 1 1 1"},
		},
		[]check{
			{at: "2m"},
			{at: "4m", fires: []firing{{map[string]string{"service": "reconciler-shim", "consumer": "reconciler-shim"},
				"reconciler-shim/reconciler-shim: a lease-mode consumer has not reached its third party for over two minutes"}}},
			{at: "6m"}, // back
		}},
	{"InboxUncertainSideEffects",
		[]series{{`inbox_uncertain_total{service="reconciler-shim",consumer="reconciler-shim"}`, "0 0 0 0 0 0 0 0 0 0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"}},
		[]check{
			{at: "11m"},
			{at: "15m", fires: []firing{{map[string]string{"service": "reconciler-shim", "consumer": "reconciler-shim"},
				"reconciler-shim/reconciler-shim: 1 side effects of unknown outcome"}}},
			{at: "34m"},
		}},
	{"ShimThirdPartyErrors",
		[]series{
			{`shim_thirdparty_errors_total{service="reconciler-shim",op="settle",kind="status"}`, "0+30x20"},
			{`shim_thirdparty_errors_total{service="reconciler-shim",op="lookup",kind="status"}`, "0x20"},
		},
		[]check{
			{at: "9m"},
			{at: "12m", fires: []firing{{map[string]string{"service": "reconciler-shim", "op": "settle", "kind": "status"},
				"reconciler-shim: third-party settle calls failing (status, 500m/s) for 10 minutes"}}},
		}},
	{"SettlementLagHigh",
		[]series{
			// Every settlement took between 10 and 100 seconds.
			{`shim_settlement_lag_seconds_bucket{service="reconciler-shim",kind="capture",le="10"}`, "0x20"},
			{`shim_settlement_lag_seconds_bucket{service="reconciler-shim",kind="capture",le="100"}`, "0+60x20"},
			{`shim_settlement_lag_seconds_bucket{service="reconciler-shim",kind="capture",le="+Inf"}`, "0+60x20"},
		},
		[]check{
			{at: "9m"},
			{at: "12m", fires: []firing{{map[string]string{"service": "reconciler-shim"},
				"p99 commit-to-settlement lag is 1m 39s"}}},
		}},
	{"ReconciliationFindings",
		[]series{
			{`reconcile_findings{service="reconcile",kind="order_without_charge",component="billing"}`, "0 0 3 3 3 3 3 3 3 3"},
			{`reconcile_findings{service="reconcile",kind="outbox_stuck",component="orders"}`, "0x10"},
		},
		[]check{
			{at: "5m"}, // found at 2m: pending for 5m
			{at: "8m", fires: []firing{{map[string]string{"kind": "order_without_charge", "component": "billing"},
				"billing: 3 order_without_charge found by the reconciliation"}}},
		}},
	{"ReconciliationStale",
		[]series{
			// Runs every minute until 5m, then stop: the timestamp freezes at 300.
			{`reconcile_last_success_timestamp_seconds{service="reconcile"}`, "0+60x5 300x30"},
		},
		[]check{
			{at: "20m"}, // 15m old: over 900 s only from 21m, pending for 5m
			{at: "30m", fires: []firing{{map[string]string{},
				"the last successful reconciliation was 25m 0s ago"}}},
		}},
	{"ReconcilerDuplicateSettlements",
		[]series{
			// Two earlier duplicates in the ledger when the counter is first
			// scraped are not new; one more at 20m is.
			{`reconciler_duplicate_settlements_total{service="reconciler",instance="reconciler:8084"}`, "2x19 3x70"},
		},
		[]check{
			{at: "10m"},
			{at: "21m", fires: []firing{{map[string]string{"service": "reconciler"},
				"reconciler: the third party booked 1 payment(s) twice in the last hour"}}},
			{at: "85m"}, // an hour without a new one
		}},
	{"PostgresServerSwitched",
		[]series{
			// orders followed a failover at 5m; billing's connections stayed.
			{`service_postgres_server_switches_total{service="orders",instance="orders:8081"}`, "0x4 1x30"},
			{`service_postgres_server_switches_total{service="billing",instance="billing:8082"}`, "0x34"},
		},
		[]check{
			{at: "4m"},
			{at: "6m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: its Postgres connections switched server (a failover) in the last 10 minutes"}}},
			{at: "20m"}, // a failover long past
		}},
	{"OutboxStandbyBehind",
		[]series{
			// orders' relay waits for a standby from 2m; billing's had a blip shorter than the for.
			{`outbox_standby_behind{service="orders",instance="orders:8081"}`, "0 0 1 1 1 1 1"},
			{`outbox_standby_behind{service="billing",instance="billing:8082"}`, "0 1 0 0 0 0 0"},
		},
		[]check{
			{at: "3m"},
			{at: "5m", fires: []firing{{map[string]string{"service": "orders"},
				"orders: the outbox relay has published nothing for 2 minutes, waiting for a standby"}}},
		}},
	{"ServiceDown",
		[]series{
			{`up{job="onceflow",service="billing",instance="billing:8082"}`, "1 1 0 0 0 0 0"},
			{`up{job="onceflow",service="orders",instance="orders:8081"}`, "1x6"},
		},
		[]check{
			{at: "3m"},
			{at: "5m", fires: []firing{{map[string]string{"job": "onceflow", "service": "billing", "instance": "billing:8082"},
				"billing (billing:8082) does not answer /metrics"}}},
		}},
}

func TestAlertRulesWithPromtool(t *testing.T) {
	rules := map[string]rule{}
	for _, r := range loadRules(t) {
		rules[r.Alert] = r
	}
	tested := map[string]bool{}
	type expAlert struct {
		ExpLabels      map[string]string `yaml:"exp_labels"`
		ExpAnnotations map[string]string `yaml:"exp_annotations"`
	}
	type alertTest struct {
		EvalTime  string     `yaml:"eval_time"`
		Alertname string     `yaml:"alertname"`
		ExpAlerts []expAlert `yaml:"exp_alerts"`
	}
	type unitTest struct {
		Interval    string      `yaml:"interval"`
		InputSeries []series    `yaml:"input_series"`
		AlertTests  []alertTest `yaml:"alert_rule_test"`
	}
	var tests []unitTest
	for _, c := range alertCases {
		r, ok := rules[c.alert]
		if !ok {
			t.Fatalf("a test case names alert %s, which alerts/ does not have", c.alert)
		}
		tested[c.alert] = true
		ut := unitTest{Interval: "1m", InputSeries: c.series}
		for _, ch := range c.checks {
			at := alertTest{EvalTime: ch.at, Alertname: c.alert, ExpAlerts: []expAlert{}}
			for _, f := range ch.fires {
				labels := map[string]string{"severity": r.Labels["severity"]}
				for k, v := range f.labels {
					labels[k] = v
				}
				// Only the summary is templated; the other annotations are
				// taken from the rule as they are.
				annotations := map[string]string{}
				for k, v := range r.Annotations {
					annotations[k] = v
				}
				annotations["summary"] = f.summary
				at.ExpAlerts = append(at.ExpAlerts, expAlert{labels, annotations})
			}
			ut.AlertTests = append(ut.AlertTests, at)
		}
		tests = append(tests, ut)
	}
	for name := range rules {
		if !tested[name] {
			t.Errorf("alert %s has no promtool test case", name)
		}
	}
	var ruleFiles []string
	files, _ := filepath.Glob("alerts/*.yml")
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		ruleFiles = append(ruleFiles, abs)
	}
	body, err := yaml.Marshal(map[string]any{
		"rule_files":          ruleFiles,
		"evaluation_interval": "1m",
		"tests":               tests,
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "alerts_test.yml")
	if err := os.WriteFile(path, body, 0o644); err != nil {
		t.Fatal(err)
	}
	out := runTool(t, ".", promtool(t), "test", "rules", path)
	t.Logf("promtool test rules:\n%s", out)
}
