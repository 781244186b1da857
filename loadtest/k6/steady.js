// Steady: a constant arrival rate of orders, the lag it produces, and the
// invariants. RATE orders/s for DURATION (defaults 200 and 60s).
//
//   bin/k6 run -e RATE=500 -e DURATION=2m loadtest/k6/steady.js
//
// LAG_P99_MS, when set, also fails the run if commit → settlement p99 exceeds it.
import { audit, maxVUs, invariantThresholds, placeOrder, probe, probeScenario, report, seconds, setupRun, summarize, summaryTrendStats } from './lib.js';

const rate = Number(__ENV.RATE || 200);
const duration = __ENV.DURATION || '60s';

const thresholds = Object.assign({}, invariantThresholds);
if (__ENV.LAG_P99_MS) {
  thresholds.settle_lag = [`p(99)<=${__ENV.LAG_P99_MS}`];
}

export const options = {
  scenarios: {
    orders: {
      executor: 'constant-arrival-rate',
      rate,
      timeUnit: '1s',
      duration,
      preAllocatedVUs: Math.min(maxVUs, Math.max(10, Math.ceil(rate / 20))),
      maxVUs,
      exec: 'order',
    },
    probe: probeScenario(duration),
  },
  thresholds,
  summaryTrendStats,
  setupTimeout: '30s',
  teardownTimeout: '10m',
};

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

export function handleSummary(data) {
  return summarize(report(data, 'steady', seconds(duration), { offeredRate: rate }));
}
