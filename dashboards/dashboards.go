package dashboards

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	"github.com/grafana/grafana-foundation-sdk/go/units"
)

// ServiceLabel is the label the scrape configuration puts on every target
// (orders, billing, reconciler-shim, reconciler); the dashboards' service
// variable and the alerts group by it.
const ServiceLabel = "service"

// sel selects the services chosen in the dashboard's service variable.
const sel = ServiceLabel + `=~"$service"`

// A board is one dashboard: rows of panels.
type board struct {
	uid, title, description string
	rows                    []row
}

type row struct {
	title  string
	panels []panel
}

// A panel is a time series (the default) or a stat.
type panel struct {
	title, description, unit string
	stat                     bool
	// width is in grid columns (24 is the full width); default 8.
	width   uint32
	queries []query
	// thresholds, when set, colour the values at and above each step: the
	// first is the "bad" line, the second the "page someone" line.
	thresholds []float64
}

type query struct {
	expr, legend string
	// exemplars shows the series' exemplars (the trace ids of sampled
	// requests) as points that open the trace.
	exemplars bool
}

func q(legend, format string, args ...any) query {
	return query{expr: fmt.Sprintf(format, args...), legend: legend}
}

// quantiles are the median and the 99th percentile of the histogram whose
// buckets are the metric bucket, by the labels by ("" for none), each
// legend prefixed with "p50" or "p99".
func quantiles(legend, bucket, by string) []query {
	var out []query
	for _, p := range []struct{ name, phi string }{{"p50", "0.5"}, {"p99", "0.99"}} {
		out = append(out, q(strings.TrimSpace(p.name+" "+legend),
			`histogram_quantile(%s, sum by (%s) (rate(%s{%s}[$__rate_interval])))`,
			p.phi, strings.TrimPrefix(by+", le", ", "), bucket, sel))
	}
	return out
}

// boards are all of onceflow's dashboards.
var boards = []board{overview, outboxBoard, inboxBoard, deadLettersBoard, shimBoard, runtimeBoard}

var overview = board{
	uid: "onceflow-overview", title: "onceflow / Overview",
	description: "Orders in, settlements out, how long the path takes and what fails on the way.",
	rows: []row{
		{"Throughput", []panel{
			{title: "Orders per second", unit: units.OpsPerSecond,
				description: "Orders placed and cancelled per second, counted after the orders commit. Healthy: follows the demand; a sudden drop to zero with traffic still arriving means the orders API is failing.",
				queries: []query{
					q("placed", `sum(rate(orders_placed_total{%s}[$__rate_interval]))`, sel),
					q("cancelled", `sum(rate(orders_cancelled_total{%s}[$__rate_interval]))`, sel),
				}},
			{title: "Settlements per second", unit: units.OpsPerSecond,
				description: "Payments the third party confirmed, by kind. Healthy: captures track orders placed, refunds track cancellations, a few seconds behind.",
				queries:     []query{q("{{kind}}", `sum by (kind) (rate(shim_forwards_total{%s}[$__rate_interval]))`, sel)}},
			{title: "Events published per second", unit: units.OpsPerSecond,
				description: "Outbox events the broker acknowledged, per producing service. Healthy: orders publishes about one event per order, billing one per payment.",
				queries:     []query{q("{{service}}", `sum by (service) (rate(outbox_published_total{%s}[$__rate_interval]))`, sel)}},
		}},
		{"Latency", []panel{
			{title: "Commit to settlement", unit: units.Seconds, width: 12, thresholds: []float64{10, 60},
				description: "From the orders commit (the order event's occurredAt) to the settlement recorded at the third party: the whole path, through two outboxes, Kafka twice and two inboxes. Healthy: p50 well under a second, p99 a few seconds. A rising p99 with flat throughput points at a backlog: see the outbox and consumer dashboards.",
				queries:     quantiles("", "shim_settlement_lag_seconds_bucket", "")},
			{title: "Outbox publish lag p99", unit: units.Seconds, width: 12, thresholds: []float64{1, 60},
				description: "From the business commit to the broker's acknowledgement, per producing service. Healthy: tens of milliseconds; seconds mean the relay is retrying or starved.",
				queries:     []query{q("{{service}}", `histogram_quantile(0.99, sum by (service, le) (rate(outbox_publish_lag_seconds_bucket{%s}[$__rate_interval])))`, sel)}},
		}},
		{"Errors", []panel{
			{title: "Failures per second", unit: units.OpsPerSecond, width: 12,
				description: "Everything that went wrong and was retried or set aside: failed publish attempts, failed handler attempts, dead letters, failed third-party calls. Healthy: zero, or short blips that the retries absorb.",
				queries: []query{
					q("publish failures {{service}}", `sum by (service) (rate(outbox_publish_failures_total{%s}[$__rate_interval]))`, sel),
					q("handler failures {{service}}", `sum by (service) (rate(inbox_failures_total{%s}[$__rate_interval]))`, sel),
					q("dead letters {{service}}", `sum by (service) (rate(inbox_dead_lettered_total{%s}[$__rate_interval]))`, sel),
					q("third-party errors", `sum(rate(shim_thirdparty_errors_total{%s}[$__rate_interval]))`, sel),
				}},
			{title: "Oldest unpublished event", unit: units.Seconds, stat: true, width: 4, thresholds: []float64{10, 60},
				description: "Age of the oldest pending outbox row, across the producing services. Healthy: 0 or under a second. Over 60 s pages (OutboxBacklogAgeOverSLO). The outbox table's signal: a service in RELAY_MODE=debezium reports 0 (Debezium marks no row); its backlog is its slot (Outbox dashboard, Replication slot row).",
				queries:     []query{q("", `max(outbox_oldest_pending_age_seconds{%s})`, sel)}},
			{title: "Dead letters waiting", unit: units.Short, stat: true, width: 4, thresholds: []float64{1, 100},
				description: "Dead-lettered events not requeued yet, plus dead outbox rows. Healthy: 0. Anything else needs an operator: see the dead-letters dashboard.",
				// Each side "or vector(0)": a sum over no series is no
				// value, and no value plus a number is no value, so with
				// the filter hiding one side (billing alone has both) the
				// stat showed nothing instead of the other side's count.
				queries: []query{q("", `(sum(inbox_dead_letters{%s}) or vector(0)) + (sum(outbox_dead_events{%s}) or vector(0))`, sel, sel)}},
			{title: "Targets up", unit: units.Short, stat: true, width: 4,
				description: "Scraped programs that answered their last scrape, of those selected. Healthy: all of them (5 with every service selected: the four programs and the reconcile job).",
				queries:     []query{q("", `sum(up{%s})`, sel)}},
		}},
		{"Reconciliation", []panel{
			{title: "Reconciliation findings", unit: units.Short, width: 12, thresholds: []float64{1},
				description: "What the outbox and inbox left inconsistent, by kind and the component whose data has it, from the reconcile job (tools/cmd/reconcile -serve): stuck or dead outbox rows, expired leases, uncertain forwards, overdue dead letters, orders without a charge, charges without a settlement. Healthy: 0 for every kind. Run `make reconcile` for the ids and docs/reconciliation.md for what to do (ReconciliationFindings).",
				queries:     []query{q("{{kind}} {{component}}", `sum by (kind, component) (reconcile_findings{%s})`, sel)}},
			{title: "Oldest finding of each kind", unit: units.Seconds, width: 12,
				description: "Age of the oldest inconsistency of each kind at the last reconciliation (0 when none). Healthy: 0. An age that keeps growing is a finding nobody works on.",
				queries:     []query{q("{{kind}} {{component}}", `max by (kind, component) (reconcile_oldest_age_seconds{%s})`, sel)}},
		}},
	},
}

var outboxBoard = board{
	uid: "onceflow-outbox", title: "onceflow / Outbox",
	description: "The transactional outbox of each producing service (orders, billing): its backlog and its relay.",
	rows: []row{
		{"Backlog", []panel{
			{title: "Pending events", unit: units.Short,
				description: "Outbox rows committed but not yet acknowledged by the broker. Healthy: near 0, with short spikes under load that drain within seconds. The outbox table's signal, for the service's own relays: 0 in RELAY_MODE=debezium, where Debezium marks no row and the backlog is the slot's lag (Replication slot row).",
				queries:     []query{q("{{service}}", `sum by (service) (outbox_pending_events{%s})`, sel)}},
			{title: "Oldest pending age", unit: units.Seconds, thresholds: []float64{10, 60},
				description: "Age of the oldest pending row: how stale the newest news downstream can be. Healthy: under a second. The SLO is 60 s (OutboxBacklogAgeOverSLO); a line that climbs steadily means nothing is publishing. The outbox table's signal: 0 in RELAY_MODE=debezium (see the Replication slot row).",
				queries:     []query{q("{{service}}", `max by (service) (outbox_oldest_pending_age_seconds{%s})`, sel)}},
			{title: "Dead rows", unit: units.Short, thresholds: []float64{1},
				description: "Rows that exhausted their publish attempts and wait for `POST /admin/outbox/requeue`. Healthy: 0; they hold back the later events of their aggregate.",
				queries:     []query{q("{{service}}", `max by (service) (outbox_dead_events{%s})`, sel)}},
		}},
		{"Relay", []panel{
			{title: "Published per second", unit: units.OpsPerSecond,
				description: "Events the broker acknowledged and the relay marked published. Healthy: matches the rate events are written; flat zero while rows are pending means the relay is stalled (OutboxRelayStalled).",
				queries:     []query{q("{{service}}", `sum by (service) (rate(outbox_published_total{%s}[$__rate_interval]))`, sel)}},
			{title: "Publish lag", unit: units.Seconds, thresholds: []float64{1, 60},
				description: "Commit to broker acknowledgement. Healthy: p50 a few milliseconds, p99 under 100 ms (the relay wakes on commit). Seconds mean retries or a slow broker.",
				queries:     quantiles("{{service}}", "outbox_publish_lag_seconds_bucket", "service")},
			{title: "Failures, retries and rows gone dead", unit: units.OpsPerSecond,
				description: "Publish attempts that failed because of the message (too large, refused by a topic policy; each row counts, MaxAttempts make it dead), events published on a retry, and rows that went dead. Healthy: all zero. A broker outage does not show here (see Kafka errors): it is waited out without charging rows.",
				queries: []query{
					q("failures {{service}}", `sum by (service) (rate(outbox_publish_failures_total{%s}[$__rate_interval]))`, sel),
					q("retries {{service}}", `sum by (service) (rate(outbox_publish_retries_total{%s}[$__rate_interval]))`, sel),
					q("gone dead {{service}}", `sum by (service) (rate(outbox_dead_total{%s}[$__rate_interval]))`, sel),
				}},
			{title: "Batch size", unit: units.Short, width: 12,
				description: "Rows per relay batch. Healthy: 1 to a few at low load (the relay wakes on each commit); growing towards the batch size (500) means the relay is falling behind.",
				queries:     quantiles("{{service}}", "outbox_batch_size_bucket", "service")},
			{title: "Owned partitions per relay", unit: units.Short, width: 12,
				description: "Logical outbox partitions (64 per service) each relay instance owns. Healthy: the 64 split evenly across a service's instances; a service whose instances own fewer than 64 in total is rebalancing or has lost a relay.",
				queries:     []query{q("{{service}} {{instance}}", `sum by (service, instance) (outbox_owned_partitions{%s})`, sel)}},
			{title: "Relay connected to Kafka", unit: units.Short, width: 12,
				description: "1 while a relay's last publish reached Kafka, 0 while Kafka is unreachable and the relay backs off (rows wait, uncharged, and go out when it is back). Healthy: 1 for every instance; 0 for over a minute pages (OutboxKafkaDisconnected).",
				queries:     []query{q("{{service}} {{instance}}", `min by (service, instance) (outbox_kafka_connected{%s})`, sel)}},
			{title: "Kafka and Postgres errors", unit: units.OpsPerSecond, width: 12,
				description: "Rows whose publish failed because of the broker (unreachable, not leader, timed out; each row counts), and failed Postgres operations of the relay by op. Both are outages the relay waits out with backoff, never charged to a row. Healthy: 0; a blip during a broker or database restart is normal.",
				queries: []query{
					q("kafka {{service}}", `sum by (service) (rate(outbox_kafka_errors_total{%s}[$__rate_interval]))`, sel),
					q("postgres {{op}} {{service}}", `sum by (service, op) (rate(outbox_db_errors_total{%s}[$__rate_interval]))`, sel),
				}},
		}},
		{"Replication slot (cdc, wal, debezium)", []panel{
			{title: "Slot lag", unit: units.BytesIEC, thresholds: []float64{256 << 20, 1 << 30},
				description: "WAL written since the position the slot's reader confirmed: the service's own log-based relay (RELAY_MODE=cdc, wal) or Debezium (RELAY_MODE=debezium, DEBEZIUM_SLOT), where it is the backlog signal. Healthy: near 0 while events flow (a quiet outbox in a busy cluster holds WAL too). Over 1 GiB for 5 minutes pages (OutboxSlotRetainingWAL). 0 in poll mode.",
				queries:     []query{q("{{service}}", `max by (service) (outbox_slot_lag_bytes{%s})`, sel)}},
			{title: "WAL retained of max_slot_wal_keep_size", unit: units.PercentUnit, thresholds: []float64{0.25, 0.5},
				description: "WAL the slot keeps from being recycled, as a share of max_slot_wal_keep_size (0 when unlimited). Healthy: a few percent. Past 100% Postgres invalidates the slot; over 50% pages (OutboxSlotNearInvalidation).",
				queries:     []query{q("{{service}}", `max by (service) (outbox_slot_retained_wal_bytes{%s} / outbox_slot_wal_keep_size_bytes{%s})`, sel, sel)}},
			{title: "Streaming from the slot", unit: units.Short,
				description: "Who reads the slot. relay: 1 on the instance whose log-based relay streams (the others stand by). debezium: 1 while a connection streams from Debezium's slot, read by the service from pg_replication_slots (always 1 in the other modes). Healthy: 1 on one relay instance in cdc and wal, 1 for debezium; debezium 0 for 5 minutes pages (OutboxExternalPublisherDown).",
				queries: []query{
					q("relay {{service}} {{instance}}", `max by (service, instance) (outbox_slot_active{%s})`, sel),
					q("debezium {{service}}", `min by (service) (outbox_external_publisher_streaming{%s})`, sel),
				}},
		}},
	},
}

var inboxBoard = board{
	uid: "onceflow-inbox", title: "onceflow / Inbox and consumers",
	description: "The idempotent inbox of each consuming service (billing, reconciler-shim): throughput, dedupe, failures and lag.",
	rows: []row{
		{"Throughput", []panel{
			{title: "Processed per second", unit: units.OpsPerSecond,
				description: "Events handled and committed with their inbox row. Healthy: follows the producer's publish rate.",
				queries:     []query{q("{{service}} {{consumer}}", `sum by (service, consumer) (rate(inbox_processed_total{%s}[$__rate_interval]))`, sel)}},
			{title: "Duplicate hit rate", unit: units.PercentUnit,
				description: "Share of deliveries that were redeliveries absorbed by the inbox. Healthy: near 0 %; bursts after a relay crash, a consumer rebalance or a replay are the inbox doing its job, a steady high rate means something redelivers in a loop.",
				queries:     []query{q("{{service}} {{consumer}}", `sum by (service, consumer) (rate(inbox_duplicates_total{%[1]s}[$__rate_interval])) / clamp_min(sum by (service, consumer) (rate(inbox_processed_total{%[1]s}[$__rate_interval]) + rate(inbox_duplicates_total{%[1]s}[$__rate_interval]) + rate(inbox_stale_total{%[1]s}[$__rate_interval])), 1e-9)`, sel)}},
			{title: "Processing time", unit: units.Seconds, thresholds: []float64{0.5, 5},
				description: "Time to handle one message, its share of the batch transaction included. Healthy: p99 in milliseconds for billing; the shim's includes the third party's answer.",
				queries:     quantiles("{{service}}", "inbox_processing_seconds_bucket", "service")},
		}},
		{"Trouble", []panel{
			{title: "Handler failures per second", unit: units.OpsPerSecond,
				description: "Failed handler attempts (each retry counts). Healthy: 0; sustained failures end as dead letters (InboxFailures).",
				queries:     []query{q("{{service}} {{consumer}}", `sum by (service, consumer) (rate(inbox_failures_total{%s}[$__rate_interval]))`, sel)}},
			{title: "Stale and out-of-order events per second", unit: units.OpsPerSecond,
				description: "Events skipped as at or below the version already applied, and events that skipped versions. Healthy: 0; stale events follow replays and requeues, gaps mean a producer lost or reordered events.",
				queries: []query{
					q("stale {{service}}", `sum by (service, consumer) (rate(inbox_stale_total{%s}[$__rate_interval]))`, sel),
					q("version gaps {{service}}", `sum by (service, consumer) (rate(inbox_version_gaps_total{%s}[$__rate_interval]))`, sel),
				}},
			{title: "Uncertain side effects", unit: units.Short, thresholds: []float64{1},
				description: "Leased messages whose side effect may or may not have happened, in the last hour: each needs reconciling by hand. Healthy: 0.",
				queries:     []query{q("{{service}} {{consumer}}", `sum by (service, consumer) (increase(inbox_uncertain_total{%s}[1h]))`, sel)}},
		}},
		{"Outages", []panel{
			{title: "Consumer connected to Kafka", unit: units.Short, width: 12,
				description: "1 while a consumer's Kafka operations (join, fetch, commit, dead-letter) succeed, 0 while one of them fails and the consumer waits the outage out: no message is charged or dead-lettered for it, and /readyz reports it. Healthy: 1 for every instance; 0 for over a minute pages (InboxKafkaDisconnected).",
				queries:     []query{q("{{consumer}} {{instance}}", `min by (service, consumer, instance) (inbox_kafka_connected{%s})`, sel)}},
			{title: "Consumer connected to Postgres", unit: units.Short, width: 12,
				description: "1 while a consumer's database operations succeed, 0 while the database is unreachable and the consumer waits it out (no attempt spent, nothing dead-lettered, no offset committed past what Postgres holds). Healthy: 1 for every instance; 0 for over a minute pages (InboxDatabaseDisconnected).",
				queries:     []query{q("{{consumer}} {{instance}}", `min by (service, consumer, instance) (inbox_database_connected{%s})`, sel)}},
			{title: "Kafka errors by op", unit: units.OpsPerSecond, width: 12,
				description: "Failed Kafka operations of the consumers, by op: join (the consumer group), fetch, commit (offsets), dead_letter (writing to <topic>.dlt). Each is retried with capped backoff. Healthy: 0; a blip during a broker restart or a rebalance is normal. dead_letter alone failing means the dead-letter topic is missing or refuses writes, and that partition waits.",
				queries:     []query{q("{{consumer}} {{op}}", `sum by (service, consumer, op) (rate(inbox_kafka_errors_total{%s}[$__rate_interval]))`, sel)}},
			{title: "Postgres errors by op", unit: units.OpsPerSecond, width: 12,
				description: "Database operations of the consumers that failed because Postgres was unreachable, by op (begin, commit, dead_letter, lease, renew_lease, count_dead_letters). Waited out, never charged to a message. Healthy: 0; a blip during a database restart or failover is normal.",
				queries:     []query{q("{{consumer}} {{op}}", `sum by (service, consumer, op) (rate(inbox_database_errors_total{%s}[$__rate_interval]))`, sel)}},
		}},
		{"Lag", []panel{
			{title: "Consumer lag per partition", unit: units.Short, width: 24,
				description: "Messages in each partition after the group's committed offset (refreshed every 5 s). Healthy: a few messages, dropping to 0 between bursts; a line that keeps climbing means the consumer is stuck or too slow (ConsumerLagGrowing). One partition climbing alone points at a poison message or a slow aggregate.",
				queries:     []query{q("{{consumer}} {{topic}}/{{partition}}", `sum by (service, consumer, topic, partition) (consumer_lag_messages{%s})`, sel)}},
		}},
	},
}

var deadLettersBoard = board{
	uid: "onceflow-dead-letters", title: "onceflow / Dead letters",
	description: "Messages the consumers set aside (<topic>.dlt) and outbox rows that went dead: what waits for an operator.",
	rows: []row{
		{"Dead-letter topics", []panel{
			{title: "Dead letters waiting", unit: units.Short, thresholds: []float64{1},
				description: "Dead-lettered events not requeued yet, per consumer: the depth an operator has to work off (GET /admin/inbox/dead-letters, then requeue). Healthy: 0.",
				queries:     []query{q("{{service}} {{consumer}}", `sum by (service, consumer) (inbox_dead_letters{%s})`, sel)}},
			{title: "Dead letters per second, by reason", unit: units.OpsPerSecond,
				description: "Messages sent to the dead-letter topic. Reasons: undecodable (not an event), invalid (broke the contract), permanent (the handler refused it), exhausted (a transient failure outlasted the retries). Healthy: 0; exhausted ones usually follow an outage downstream and can be requeued once it is over.",
				queries:     []query{q("{{consumer}} {{reason}}", `sum by (service, consumer, reason) (rate(inbox_dead_lettered_total{%s}[$__rate_interval]))`, sel)}},
			{title: "Dead-lettered in the last hour", unit: units.Short, stat: true, thresholds: []float64{1},
				description: "Messages dead-lettered in the last hour, by reason. Healthy: 0.",
				queries:     []query{q("{{reason}}", `sum by (reason) (increase(inbox_dead_lettered_total{%s}[1h]))`, sel)}},
		}},
		{"Outbox", []panel{
			{title: "Dead outbox rows", unit: units.Short, width: 12, thresholds: []float64{1},
				description: "Outbox rows that exhausted their publish attempts (GET /admin/outbox/dead, then POST /admin/outbox/requeue). Healthy: 0.",
				queries:     []query{q("{{service}}", `max by (service) (outbox_dead_events{%s})`, sel)}},
			{title: "Outbox rows going dead per second", unit: units.OpsPerSecond, width: 12,
				description: "Rows that went dead. Healthy: 0; usually a broker refusing a topic or a message for longer than the retries last.",
				queries:     []query{q("{{service}}", `sum by (service) (rate(outbox_dead_total{%s}[$__rate_interval]))`, sel)}},
		}},
	},
}

var shimBoard = board{
	uid: "onceflow-shim", title: "onceflow / Reconciler shim",
	description: "The shim forwarding each payment once to the third-party reconciler, which cannot dedupe.",
	rows: []row{
		{"Forwards", []panel{
			{title: "Forwards per second", unit: units.OpsPerSecond,
				description: "Payments recorded as settled, by kind and outcome: sent (this attempt called) or already_present (an earlier attempt had landed; the shim asked instead of calling twice). Healthy: nearly all sent; already_present follows timeouts and crashes.",
				queries:     []query{q("{{kind}} {{outcome}}", `sum by (kind, outcome) (rate(shim_forwards_total{%s}[$__rate_interval]))`, sel)}},
			{title: "Commit to settlement", unit: units.Seconds, thresholds: []float64{10, 60},
				description: "From the orders commit to the settlement recorded, by kind. Healthy: p99 a few seconds.",
				queries:     quantiles("{{kind}}", "shim_settlement_lag_seconds_bucket", "kind")},
			{title: "Uncertain forwards", unit: units.Short, thresholds: []float64{1},
				description: "Payments the shim could not tell were settled or not, in the last hour: reconcile each against the third party's ledger. Healthy: 0.",
				queries:     []query{q("{{consumer}}", `sum by (consumer) (increase(inbox_uncertain_total{%s, service="reconciler-shim"}[1h]))`, sel)}},
		}},
		{"Third party", []panel{
			{title: "Third-party errors per second", unit: units.OpsPerSecond, width: 8,
				description: "Failed calls, by op (settle, lookup) and kind: rejected (4xx, dead-lettered), status (5xx, retried), timeout (retried after a lookup), transport (no answer). Healthy: 0; status and transport errors mean the third party is down (ShimThirdPartyErrors).",
				queries:     []query{q("{{op}} {{kind}}", `sum by (op, kind) (rate(shim_thirdparty_errors_total{%s}[$__rate_interval]))`, sel)}},
			{title: "Shim consumer lag", unit: units.Short, width: 8,
				description: "billing.events messages not yet forwarded, per partition. Healthy: near 0; climbing while the third party errors is the shim waiting it out.",
				queries:     []query{q("{{topic}}/{{partition}}", `sum by (topic, partition) (consumer_lag_messages{%s, service="reconciler-shim"})`, sel)}},
			{title: "Payments booked twice", unit: units.Short, width: 8, thresholds: []float64{1},
				description: "Settlements the third party booked under an idempotency key that already had one (reconciler_duplicate_settlements_total): payments charged twice, which the shim exists to prevent. Healthy: 0, always. Any other value pages (ReconcilerDuplicateSettlements): onceflowctl journey <order id> names the key and both bookings; see docs/reconciliation.md#duplicate_settlements.",
				queries:     []query{q("booked twice", `max(reconciler_duplicate_settlements_total{%s})`, sel)}},
		}},
	},
}

const datasource = "${datasource}"

func dsRef() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr(datasource)}
}

func (b board) build() (dashboard.Dashboard, error) {
	d := dashboard.NewDashboardBuilder(b.title).
		Uid(b.uid).
		Description(b.description).
		Tags([]string{"onceflow"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").
			Label("Data source").
			Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("service").
			Label("Service").
			Description("The onceflow programs to show, by the service label the scrape configuration sets.").
			Datasource(dsRef()).
			Query(dashboard.StringOrMap{String: cog.ToPtr(VariableQuery)}).
			Definition(VariableQuery).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).
			IncludeAll(true).
			AllValue(".*").
			Current(dashboard.VariableOption{
				Selected: cog.ToPtr(true),
				Text:     dashboard.StringOrArrayOfString{String: cog.ToPtr("All")},
				Value:    dashboard.StringOrArrayOfString{String: cog.ToPtr("$__all")},
			}))
	id := uint32(1)
	for _, r := range b.rows {
		d.WithRow(dashboard.NewRowBuilder(r.title).Id(id))
		id++
		for _, p := range r.panels {
			d.WithPanel(p.builder(id))
			id++
		}
	}
	return d.Build()
}

func (p panel) builder(id uint32) cog.Builder[dashboard.Panel] {
	width := p.width
	if width == 0 {
		width = 8
	}
	steps := []dashboard.Threshold{{Value: nil, Color: "green"}}
	for i, v := range p.thresholds {
		steps = append(steps, dashboard.Threshold{Value: cog.ToPtr(v), Color: []string{"orange", "red"}[min(i, 1)]})
	}
	thresholds := dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(steps)
	if p.stat {
		b := stat.NewPanelBuilder().Id(id).Title(p.title).Description(p.description).Unit(p.unit).
			Datasource(dsRef()).Span(width).Height(6).Thresholds(thresholds).
			GraphMode(common.BigValueGraphModeArea).ColorMode(common.BigValueColorModeValue).
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}))
		for i, qr := range p.queries {
			b.WithTarget(qr.target(i, true))
		}
		return b
	}
	b := timeseries.NewPanelBuilder().Id(id).Title(p.title).Description(p.description).Unit(p.unit).
		Datasource(dsRef()).Span(width).Height(8).Min(0).Thresholds(thresholds).
		FillOpacity(10).ShowPoints(common.VisibilityModeNever).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom))
	if len(p.thresholds) > 0 {
		b.ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeDashed))
	}
	for i, qr := range p.queries {
		b.WithTarget(qr.target(i, false))
	}
	return b
}

func (qr query) target(i int, instant bool) *prometheus.DataqueryBuilder {
	t := prometheus.NewDataqueryBuilder().
		Datasource(dsRef()).
		RefId(string(rune('A' + i))).
		Expr(qr.expr).
		LegendFormat(qr.legend)
	if qr.legend == "" {
		t.LegendFormat("__auto")
	}
	if qr.exemplars {
		t.Exemplar(true)
	}
	if instant {
		return t.Instant()
	}
	return t.Range()
}

// runtimeBoard is what every Go service has, whatever it does: its HTTP
// requests (rate, errors, duration: the RED metrics of
// httpserver.HTTPMetrics), the Go runtime and the process.
var runtimeBoard = board{
	uid: "onceflow-runtime", title: "onceflow / HTTP, Go runtime and process",
	description: "Each program's HTTP API (requests, errors, latency by route template, with exemplars that open the request's trace), its Go runtime and its process.",
	rows: []row{
		{"HTTP", []panel{
			{title: "Requests per second", unit: units.OpsPerSecond,
				description: "Requests each program's public API answered, by route template (never the raw path) and status class; the probes and scrapes are not counted. Healthy: follows the demand, nearly all 2xx.",
				queries:     []query{q("{{service}} {{method}} {{route}} {{status_class}}", `sum by (service, method, route, status_class) (rate(http_requests_total{%s}[$__rate_interval]))`, sel)}},
			{title: "Server errors ratio", unit: units.PercentUnit, thresholds: []float64{0.01, 0.05},
				description: "Share of requests answered 5xx, per program. Healthy: 0 (shown as 0, not as no data, while nothing fails); a 503 is a dependency away (the body says which, /readyz too), a 500 is a bug whose request id is in the log. 4xx are the clients' and not counted here.",
				queries:     []query{q("{{service}}", `(sum by (service) (rate(http_requests_total{%s, status_class="5xx"}[$__rate_interval])) or 0 * sum by (service) (rate(http_requests_total{%s}[$__rate_interval]))) / sum by (service) (rate(http_requests_total{%s}[$__rate_interval]))`, sel, sel, sel)}},
			{title: "Request duration p99", unit: units.Seconds, thresholds: []float64{0.5, 2},
				description: "99th percentile of the time to answer, by program and route template. The dots are exemplars: a traced request in that bucket; click one to open its trace (tracing on: OTEL_EXPORTER_OTLP_ENDPOINT). Healthy: tens of milliseconds; POST /orders waits for its commit.",
				queries: []query{{expr: fmt.Sprintf(`histogram_quantile(0.99, sum by (service, route, le) (rate(http_request_duration_seconds_bucket{%s}[$__rate_interval])))`, sel),
					legend: "{{service}} {{route}}", exemplars: true}}},
		}},
		{"Go runtime", []panel{
			{title: "Goroutines", unit: units.Short,
				description: "Live goroutines per program. Healthy: flat under steady load (workers, connections); a steady climb is a leak.",
				queries:     []query{q("{{service}}", `sum by (service) (go_goroutines{%s})`, sel)}},
			{title: "Heap in use", unit: units.BytesIEC,
				description: "Bytes of heap spans in use per program. Healthy: a sawtooth around a flat level; a rising floor is memory kept alive.",
				queries:     []query{q("{{service}}", `sum by (service) (go_memstats_heap_inuse_bytes{%s})`, sel)}},
			{title: "GC pause per second", unit: units.Seconds,
				description: "Time per second the garbage collector stopped the world, per program. Healthy: well under a millisecond per second; more means allocation pressure (see the heap).",
				queries:     []query{q("{{service}}", `sum by (service) (rate(go_gc_duration_seconds_sum{%s}[$__rate_interval]))`, sel)}},
		}},
		{"Process", []panel{
			{title: "CPU", unit: units.Short,
				description: "CPU seconds per second per program (1 = one core busy). Healthy: proportional to the load; a program pinned at its cores' count is the bottleneck.",
				queries:     []query{q("{{service}}", `sum by (service) (rate(process_cpu_seconds_total{%s}[$__rate_interval]))`, sel)}},
			{title: "Resident memory", unit: units.BytesIEC,
				description: "Resident set size per program. Healthy: flat under steady load, well under the container's limit.",
				queries:     []query{q("{{service}}", `sum by (service) (process_resident_memory_bytes{%s})`, sel)}},
			{title: "Open file descriptors", unit: units.PercentUnit, thresholds: []float64{0.8},
				description: "Open file descriptors as a share of the limit, per program (sockets to Postgres, Kafka and clients count). Healthy: far below 1; near it, new connections fail.",
				queries:     []query{q("{{service}}", `max by (service) (process_open_fds{%s} / process_max_fds{%s})`, sel, sel)}},
		}},
	},
}

// VariableQuery lists the values of the service variable.
const VariableQuery = "label_values(up, " + ServiceLabel + ")"

// Files returns every dashboard as indented JSON, keyed by file name
// (<uid>.json).
func Files() (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, b := range boards {
		d, err := b.build()
		if err != nil {
			return nil, fmt.Errorf("building %s: %w", b.uid, err)
		}
		body, err := json.MarshalIndent(d, "", "  ")
		if err != nil {
			return nil, fmt.Errorf("encoding %s: %w", b.uid, err)
		}
		out[b.uid+".json"] = append(body, '\n')
	}
	return out, nil
}

// Queries returns every PromQL expression of the dashboards in files (as
// Files returns them, or as read from disk), each named after its dashboard
// and panel, with the service variable's own query.
func Queries(files map[string][]byte) (map[string]string, error) {
	out := map[string]string{}
	for name, body := range files {
		var d struct {
			Panels []struct {
				Title   string `json:"title"`
				Type    string `json:"type"`
				Targets []struct {
					Expr  string `json:"expr"`
					RefID string `json:"refId"`
				} `json:"targets"`
			} `json:"panels"`
			Templating struct {
				List []struct {
					Name  string `json:"name"`
					Type  string `json:"type"`
					Query any    `json:"query"`
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(body, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for _, p := range d.Panels {
			for _, t := range p.Targets {
				out[fmt.Sprintf("%s: %s [%s]", strings.TrimSuffix(name, ".json"), p.Title, t.RefID)] = t.Expr
			}
		}
		for _, v := range d.Templating.List {
			if s, ok := v.Query.(string); ok && v.Type == "query" {
				out[fmt.Sprintf("%s: variable %s", strings.TrimSuffix(name, ".json"), v.Name)] = s
			}
		}
	}
	return out, nil
}
