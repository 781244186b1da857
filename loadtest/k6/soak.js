// Soak: a steady rate for a long time, to show what only time reveals:
// growing backlogs, slowing queries as tables grow, leaks. SOAK_RATE orders/s
// (default 200) for SOAK_DURATION (default 30m).
//
//   bin/k6 run -e SOAK_DURATION=2h -e SOAK_RATE=300 loadtest/k6/soak.js
//
// Besides the invariants it fails when the unsettled orders ever exceed
// MAX_BACKLOG_SECONDS (default 30) of load, or when lag p99 exceeds
// LAG_P99_MS (default 1000): a soak at a rate the platform cannot hold
// says nothing about time.
import { constantRate, probeScenario, report, seconds, summarize, withDefaults } from './lib.js';

export { setup, order, probeLoop, teardown } from './lib.js';

const rate = Number(__ENV.SOAK_RATE || 200);
const duration = __ENV.SOAK_DURATION || '30m';
const maxBacklogSeconds = Number(__ENV.MAX_BACKLOG_SECONDS || 30);

export const options = withDefaults({
  scenarios: { orders: constantRate(rate, duration), probe: probeScenario(duration) },
  thresholds: {
    settle_lag: [`p(99)<=${Number(__ENV.LAG_P99_MS || 1000)}`],
    orders_unsettled: [`max<=${rate * maxBacklogSeconds}`],
  },
});

export function handleSummary(data) {
  return summarize(report(data, 'soak', seconds(duration), { offeredRate: rate }));
}
