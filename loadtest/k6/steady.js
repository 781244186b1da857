// Steady: a constant arrival rate of orders, the lag it produces, and the
// invariants. RATE orders/s for DURATION (defaults 200 and 60s).
//
//   bin/k6 run -e RATE=500 -e DURATION=2m loadtest/k6/steady.js
//
// LAG_P99_MS, when set, also fails the run if commit → settlement p99 exceeds it.
import { constantRate, probeScenario, report, seconds, summarize, withDefaults } from './lib.js';

export { setup, order, probeLoop, teardown } from './lib.js';

const rate = Number(__ENV.RATE || 200);
const duration = __ENV.DURATION || '60s';

export const options = withDefaults({
  scenarios: { orders: constantRate(rate, duration), probe: probeScenario(duration) },
  thresholds: __ENV.LAG_P99_MS ? { settle_lag: [`p(99)<=${__ENV.LAG_P99_MS}`] } : {},
});

export function handleSummary(data) {
  return summarize(report(data, 'steady', seconds(duration), { offeredRate: rate }));
}
