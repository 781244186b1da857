// Shared by every scenario: where the platform is, how an order is placed,
// the probe that turns settled orders into lag samples, the end-of-run audit,
// and the report. The scenarios only say what load to offer.
//
// Run with the project's k6 (`make k6` builds bin/k6 with k6/x/onceflow).
// Every setting comes from the environment; the defaults match `make services`.
import { sleep } from 'k6';
import http from 'k6/http';
import exec from 'k6/execution';
import { Counter, Gauge, Trend } from 'k6/metrics';
import onceflow from 'k6/x/onceflow';

export const env = {
  ordersURL: __ENV.ORDERS_URL || 'http://127.0.0.1:8081',
  billingURL: __ENV.BILLING_URL || 'http://127.0.0.1:8082',
  shimURL: __ENV.SHIM_URL || 'http://127.0.0.1:8083',
  reconcilerURL: __ENV.RECONCILER_URL || 'http://127.0.0.1:8084',
  // The operator listeners (ADMIN_ADDR), where /metrics is served.
  ordersAdminURL: __ENV.ORDERS_ADMIN_URL || 'http://127.0.0.1:9081',
  billingAdminURL: __ENV.BILLING_ADMIN_URL || 'http://127.0.0.1:9082',
  shimAdminURL: __ENV.SHIM_ADMIN_URL || 'http://127.0.0.1:9083',
  ordersDB: __ENV.ORDERS_DB || 'postgres://postgres:postgres@127.0.0.1:7432/orders?sslmode=disable',
  billingDB: __ENV.BILLING_DB || 'postgres://postgres:postgres@127.0.0.1:7432/billing?sslmode=disable',
  shimDB: __ENV.SHIM_DB || 'postgres://postgres:postgres@127.0.0.1:7432/shim?sslmode=disable',
  brokers: __ENV.KAFKA_BROKERS || '127.0.0.1:7092',
  ordersTopic: __ENV.ORDERS_TOPIC || 'orders.events',
  // How long the audit waits for the last orders to settle after the load.
  drainTimeoutMs: Number(__ENV.DRAIN_TIMEOUT_MS || 120000),
  // Where handleSummary writes the report as JSON (besides stdout).
  summaryJSON: __ENV.SUMMARY_JSON || '',
};

// One client per VU, all sharing the process's pools and order tracker.
export const platform = onceflow.connect({
  ordersDB: env.ordersDB,
  billingDB: env.billingDB,
  shimDB: env.shimDB,
  brokers: env.brokers,
  ordersTopic: env.ordersTopic,
});

export const metrics = {
  placed: new Counter('orders_placed'),
  orderErrors: new Counter('order_errors'),
  lag: new Trend('settle_lag', true), // commit → settlement at the third party
  settled: new Counter('orders_settled'),
  lost: new Counter('settlements_lost'),
  duplicated: new Counter('settlements_duplicated'),
  thirdPartyDuplicates: new Counter('third_party_duplicates'),
  backlogOrders: new Gauge('outbox_backlog_orders'),
  backlogBilling: new Gauge('outbox_backlog_billing'),
  // Kafka consumer lag (messages) of billing (orders.events) and the shim
  // (billing.events): with the outbox backlogs, they show where a backlog sits.
  consumerLagBilling: new Gauge('consumer_lag_billing'),
  consumerLagShim: new Gauge('consumer_lag_shim'),
  // A trend, not a gauge: thresholds can then bound its max (the soak does).
  pending: new Trend('orders_unsettled'),
};

// The invariants: every run fails on a lost or a duplicated settlement.
export const invariantThresholds = {
  settlements_lost: ['count==0'],
  settlements_duplicated: ['count==0'],
  third_party_duplicates: ['count==0'],
  orders_placed: ['count>0'],
  // Always true: a threshold is what makes k6 keep a tagged sub-metric, and
  // the report wants POST /orders alone, without the probe's reads.
  'http_req_duration{name:POST /orders}': ['max>=0'],
};

// maxVUs caps the VUs an arrival-rate scenario may add when the platform
// slows down (MAX_VUS, default 300). Past it k6 drops iterations and counts
// them (dropped_iterations), so the offered load stays open and k6 itself
// does not eat the two cores the platform needs.
export const maxVUs = Number(__ENV.MAX_VUS || 300);

export const summaryTrendStats = ['avg', 'min', 'med', 'p(95)', 'p(99)', 'max'];

// withDefaults completes a scenario's options: the invariants' thresholds
// (added to the script's own), the summary's statistics, and time for setup
// and for the audit's drain.
export function withDefaults(o) {
  return Object.assign({
    summaryTrendStats,
    setupTimeout: '30s',
    teardownTimeout: '10m',
  }, o, { thresholds: Object.assign({}, invariantThresholds, o.thresholds || {}) });
}

// constantRate is the orders scenario of steady load: rate orders/s for duration.
export function constantRate(rate, duration) {
  return {
    executor: 'constant-arrival-rate',
    rate,
    timeUnit: '1s',
    duration,
    preAllocatedVUs: Math.min(maxVUs, Math.max(10, Math.ceil(rate / 20))),
    maxVUs,
    exec: 'order',
  };
}

// rampingRate is the orders scenario of a changing load: from startRate
// through k6's stages ({ duration, target } in orders/s).
export function rampingRate(startRate, stages) {
  return {
    executor: 'ramping-arrival-rate',
    startRate,
    timeUnit: '1s',
    stages,
    preAllocatedVUs: 20,
    maxVUs,
    exec: 'order',
  };
}

// taggedProbe is the probe scenario's function of a script that tags each
// lag sample by when its order was placed: tagOf(ms since the load started).
//   export const probeLoop = taggedProbe((sinceStartMs) => ({ step: stepOf(sinceStartMs) }));
export function taggedProbe(tagOf) {
  let start = 0;
  return function probeLoop() {
    start = start || exec.scenario.startTime;
    probe((placedMs) => tagOf(placedMs - start));
  };
}

// The lifecycle of a scenario without tags; scripts re-export what fits:
//   export { setup, order, probeLoop, teardown } from './lib.js';
export function setup() {
  return setupRun();
}

export function order() {
  placeOrder();
}

export function probeLoop() {
  probe();
}

export function teardown(data) {
  audit(data);
}

const currencies = ['EUR', 'USD', 'GBP', 'CHF', 'JPY'];
const jsonHeaders = { 'Content-Type': 'application/json' };

// placeOrder is one iteration of the load: POST /orders, then track the
// order so the probe can time its settlement. tags label the samples (the
// ramp tags each step).
export function placeOrder(tags) {
  const body = JSON.stringify({
    customerId: `k6-customer-${exec.vu.idInTest % 100}`,
    amountCents: 100 + Math.floor(Math.random() * 100000),
    currency: currencies[exec.scenario.iterationInTest % currencies.length],
  });
  const res = http.post(`${env.ordersURL}/orders`, body, {
    headers: jsonHeaders,
    tags: Object.assign({ name: 'POST /orders' }, tags || {}),
  });
  if (res.status !== 201) {
    metrics.orderErrors.add(1, tags);
    return;
  }
  const o = res.json();
  platform.track(o.id, o.createdAt);
  metrics.placed.add(1, tags);
}

// probe runs in its own one-VU scenario: every half second it turns the
// orders that settled into lag samples and samples the outbox backlogs.
// tagOf(placedMs) may label a lag sample by when its order was placed.
export function probe(tagOf) {
  record(platform.poll(), tagOf);
  const b = platform.backlog();
  metrics.backlogOrders.add(b.orders);
  metrics.backlogBilling.add(b.billing);
  metrics.consumerLagBilling.add(metricValue(env.billingAdminURL, 'consumer_lag_messages'));
  metrics.consumerLagShim.add(metricValue(env.shimAdminURL, 'consumer_lag_messages'));
  sleep(0.5);
}

function record(s, tagOf) {
  for (let i = 0; i < s.lagMs.length; i++) {
    metrics.lag.add(s.lagMs[i], tagOf ? tagOf(s.placedMs[i]) : undefined);
  }
  metrics.settled.add(s.lagMs.length);
  metrics.pending.add(s.pending);
}

// probeScenario is the scenario that runs probe for the load's duration.
export function probeScenario(duration, exec) {
  return { executor: 'constant-vus', vus: 1, duration, exec: exec || 'probeLoop', gracefulStop: '5s' };
}

// thirdPartyDuplicates reads how many bookings the third party took twice
// under one idempotency key (its own count, across all runs of its ledger).
function thirdPartyDuplicates() {
  const res = http.get(`${env.reconcilerURL}/stats`, { tags: { name: 'GET /stats' } });
  if (res.status !== 200) {
    throw new Error(`reconciler /stats: ${res.status} ${res.body}`);
  }
  return res.json().duplicates;
}

// setup remembers the third party's duplicate count before the load, and
// when the load starts (within the milliseconds k6 takes to begin it).
export function setupRun() {
  return { thirdPartyDuplicates: thirdPartyDuplicates(), startedAt: Date.now() };
}

// audit, for teardown: wait for the last settlements, then count lost and
// duplicated ones. Its samples count toward the thresholds.
export function audit(data, tagOf) {
  const a = platform.audit(env.drainTimeoutMs);
  record(a.late, tagOf);
  metrics.lost.add(a.lost);
  metrics.duplicated.add(a.duplicated);
  metrics.thirdPartyDuplicates.add(thirdPartyDuplicates() - data.thirdPartyDuplicates);
  console.log(`audit: ${a.tracked} orders tracked, ${a.settled} settled, ${a.lost} lost, ` +
    `${a.duplicated} duplicated; waited ${(a.waitedMs / 1000).toFixed(1)} s for the last ones`);
  return a;
}

// metricValue sums a Prometheus counter or gauge from a service's /metrics
// (baseURL is its operator listener).
export function metricValue(baseURL, name) {
  const res = http.get(`${baseURL}/metrics`, { tags: { name: 'GET /metrics' } });
  let sum = 0;
  for (const line of res.body.split('\n')) {
    if (line.startsWith(name + ' ') || line.startsWith(name + '{')) {
      sum += Number(line.slice(line.lastIndexOf(' ') + 1));
    }
  }
  return sum;
}

function value(data, metric, stat) {
  const m = data.metrics[metric];
  return m && m.values[stat] !== undefined ? m.values[stat] : 0;
}

// report distils k6's summary into the numbers the scenarios promise;
// loadSeconds is how long load was offered (the run also spends time
// draining, which must not dilute orders/s).
export function report(data, scenario, loadSeconds, extra) {
  const r = Object.assign({
    scenario,
    loadSeconds,
    ordersPlaced: value(data, 'orders_placed', 'count'),
    ordersPerSecond: value(data, 'orders_placed', 'count') / loadSeconds,
    droppedIterations: value(data, 'dropped_iterations', 'count'),
    httpP50Ms: value(data, 'http_req_duration{name:POST /orders}', 'med'),
    httpP95Ms: value(data, 'http_req_duration{name:POST /orders}', 'p(95)'),
    httpP99Ms: value(data, 'http_req_duration{name:POST /orders}', 'p(99)'),
    lagP50Ms: value(data, 'settle_lag', 'med'),
    lagP99Ms: value(data, 'settle_lag', 'p(99)'),
    lagMaxMs: value(data, 'settle_lag', 'max'),
    settled: value(data, 'orders_settled', 'count'),
    backlogPeakOrders: value(data, 'outbox_backlog_orders', 'max'),
    backlogPeakBilling: value(data, 'outbox_backlog_billing', 'max'),
    consumerLagPeakBilling: value(data, 'consumer_lag_billing', 'max'),
    consumerLagPeakShim: value(data, 'consumer_lag_shim', 'max'),
    errors: value(data, 'order_errors', 'count'),
    lost: value(data, 'settlements_lost', 'count'),
    duplicated: value(data, 'settlements_duplicated', 'count'),
    thirdPartyDuplicates: value(data, 'third_party_duplicates', 'count'),
    thresholdsFailed: Object.entries(data.metrics)
      .flatMap(([name, m]) => Object.entries(m.thresholds || {}).filter(([, t]) => !t.ok).map(([t]) => `${name}: ${t}`)),
  }, extra || {});
  return r;
}

function fmt(n, digits) {
  return Number(n).toFixed(digits === undefined ? 1 : digits);
}

// summarize is every scenario's handleSummary: a short table on stdout and,
// with SUMMARY_JSON, the report as JSON for `make bench`.
export function summarize(r) {
  const lines = [
    '',
    `onceflow ${r.scenario}: ${r.loadSeconds} s of load`,
    `  orders placed          ${r.ordersPlaced} (${fmt(r.ordersPerSecond)} orders/s; ${r.droppedIterations} iterations dropped)`,
    `  POST /orders           p50 ${fmt(r.httpP50Ms)} ms   p95 ${fmt(r.httpP95Ms)} ms   p99 ${fmt(r.httpP99Ms)} ms`,
    `  commit → settlement    p50 ${fmt(r.lagP50Ms)} ms   p99 ${fmt(r.lagP99Ms)} ms   max ${fmt(r.lagMaxMs)} ms   (${r.settled} settled)`,
    `  outbox backlog peak    orders ${r.backlogPeakOrders}   billing ${r.backlogPeakBilling}`,
    `  consumer lag peak      billing ${r.consumerLagPeakBilling}   shim ${r.consumerLagPeakShim} (messages)`,
    `  errors                 ${r.errors} failed orders`,
    `  invariants             ${r.lost} lost, ${r.duplicated} duplicated, ${r.thirdPartyDuplicates} booked twice by the third party`,
  ];
  if (r.duplicatesAbsorbed !== undefined) {
    lines.push(`  redeliveries           ${r.duplicatesAbsorbed} counted as duplicates by billing; ${r.poisonDeadLettered} poison messages dead-lettered`);
  }
  if (r.steps) {
    lines.push('  steps (offered → achieved orders/s, lag p99):');
    for (const s of r.steps) {
      lines.push(`    ${String(s.rate).padStart(6)} → ${fmt(s.achieved).padStart(7)}   p99 ${fmt(s.lagP99Ms).padStart(8)} ms   ${s.ok ? 'ok' : 'over'}`);
    }
    lines.push(`  knee: ${r.knee} orders/s (highest step with lag p99 ≤ ${r.lagBudgetMs} ms and ≥ 95% of the offered rate)`);
  }
  lines.push(r.thresholdsFailed.length ? `  THRESHOLDS FAILED: ${r.thresholdsFailed.join('; ')}` : '  thresholds: all passed');
  lines.push('');
  const out = { stdout: lines.join('\n') };
  if (env.summaryJSON) {
    out[env.summaryJSON] = JSON.stringify(r, null, 2);
  }
  return out;
}

// seconds parses a k6 duration such as "90s", "2m" or "1h30m".
export function seconds(d) {
  let total = 0;
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h)/g;
  let m;
  while ((m = re.exec(d)) !== null) {
    total += Number(m[1]) * { ms: 0.001, s: 1, m: 60, h: 3600 }[m[2]];
  }
  return total;
}
