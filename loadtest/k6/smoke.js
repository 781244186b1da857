// Smoke: a few seconds of load with every check on, run by `make test`
// (loadtest/bench/rig/smoke_test.go). Besides orders it redelivers published
// events (duplicates) and sends poison messages through the extension, and
// the thresholds require that billing absorbed and dead-lettered them while
// every order still settled exactly once.
//
//   bin/k6 run loadtest/k6/smoke.js
import { check, sleep } from 'k6';
import { Counter } from 'k6/metrics';
import { audit, constantRate, env, metricValue, platform, probeScenario, report, seconds, setupRun, summarize, withDefaults } from './lib.js';

export { order, probeLoop } from './lib.js';

const rate = Number(__ENV.RATE || 20);
const duration = __ENV.DURATION || '5s';
const poison = 3; // from platform.poison, plus one hand-made with platform.produce
const duplicates = 20;

const absorbed = new Counter('duplicates_absorbed');
const deadLettered = new Counter('poison_dead_lettered');

export const options = withDefaults({
  scenarios: {
    orders: Object.assign(constantRate(rate, duration), { preAllocatedVUs: 5, maxVUs: 20 }),
    probe: probeScenario(duration),
  },
  thresholds: {
    settle_lag: ['p(99)<10000'],
    order_errors: ['count==0'],
    // Billing counted every redelivery as a duplicate and dead-lettered
    // every poison message (teardown adds what its metrics say).
    duplicates_absorbed: [`count>=${duplicates}`],
    poison_dead_lettered: [`count>=${poison + 1}`],
    checks: ['rate==1'],
  },
  teardownTimeout: '3m',
});

export function setup() {
  const d = setupRun();
  d.duplicatesBefore = metricValue(env.billingAdminURL, 'inbox_duplicates_total');
  d.deadBefore = metricValue(env.billingAdminURL, 'inbox_dead_lettered_total');
  return d;
}

export function teardown(data) {
  // Redeliver some published events and send poison, then wait until
  // billing's metrics show it absorbed and dead-lettered them.
  check(platform.duplicate(duplicates), { 'redelivered as many events as asked': (n) => n === duplicates });
  check(platform.poison(poison), { 'sent the poison messages': (n) => n === poison });
  // An envelope whose event id is no UUID: undecodable, so dead-lettered too.
  platform.produce(env.ordersTopic, 'k6-smoke-bad-envelope', '{}', { 'event-id': 'not-a-uuid', 'event-type': 'OrderPlaced' });
  let dups = 0;
  let dead = 0;
  const deadline = Date.now() + 60000;
  while (Date.now() < deadline) {
    dups = metricValue(env.billingAdminURL, 'inbox_duplicates_total') - data.duplicatesBefore;
    dead = metricValue(env.billingAdminURL, 'inbox_dead_lettered_total') - data.deadBefore;
    if (dups >= duplicates && dead >= poison + 1) {
      break;
    }
    sleep(0.2);
  }
  absorbed.add(dups);
  deadLettered.add(dead);
  // Every order settled exactly once, the redeliveries included, and the
  // three ledgers agree (the warm-up order is in all three).
  audit(data);
  check(platform.counts(), {
    'orders, charges and forwarded payments agree': (c) => c.orders > 0 && c.orders === c.charges && c.charges === c.forwards,
  });
}

export function handleSummary(data) {
  return summarize(report(data, 'smoke', seconds(duration), {
    offeredRate: rate,
    duplicatesAbsorbed: data.metrics.duplicates_absorbed ? data.metrics.duplicates_absorbed.values.count : 0,
    poisonDeadLettered: data.metrics.poison_dead_lettered ? data.metrics.poison_dead_lettered.values.count : 0,
  }));
}
