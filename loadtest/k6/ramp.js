// Ramp: offered load climbs in steps, each held for STEP_DURATION, to find
// the knee: the highest rate the platform sustains with commit → settlement
// p99 within LAG_BUDGET_MS (default 100). Every lag sample is tagged with
// the step its order was placed in, so each step gets its own p99.
//
//   bin/k6 run -e STEPS=100,200,400,800 -e STEP_DURATION=15s loadtest/k6/ramp.js
//
// Past the knee the backlog would grow without bound and the audit would
// wait for all of it; once more than MAX_BACKLOG_SECONDS (default 5) of
// the current step's orders are unsettled, iterations skip placing orders
// (they count as not achieved), which keeps the run's length bounded.
import exec from 'k6/execution';
import { audit, placeOrder, platform, probeScenario, rampingRate, report, seconds, setupRun, summarize, taggedProbe, withDefaults } from './lib.js';

const steps = (__ENV.STEPS || '100,200,300,400,500,600,800,1000,1500,2000').split(',').map(Number);
const stepDuration = __ENV.STEP_DURATION || '10s';
const rampSeconds = 3;
const budgetMs = Number(__ENV.LAG_BUDGET_MS || 100);
const maxBacklogSeconds = Number(__ENV.MAX_BACKLOG_SECONDS || 5);

const hold = seconds(stepDuration);
const period = rampSeconds + hold;
const total = period * steps.length;

const stages = [];
for (const rate of steps) {
  stages.push({ duration: `${rampSeconds}s`, target: rate }, { duration: stepDuration, target: rate });
}

// stepOf names the step a moment (ms since the load started) belongs to:
// the step's rate on its plateau, "ramp" while climbing to it.
function stepOf(sinceStartMs) {
  const t = sinceStartMs / 1000;
  const i = Math.min(steps.length - 1, Math.max(0, Math.floor(t / period)));
  return t - i * period < rampSeconds ? 'ramp' : String(steps[i]);
}

const thresholds = {};
for (const rate of steps) {
  // Always true: they make k6 keep each step's sub-metrics for the report.
  thresholds[`settle_lag{step:${rate}}`] = ['max>=0'];
  thresholds[`orders_placed{step:${rate}}`] = ['count>=0'];
}

export const options = withDefaults({
  scenarios: {
    orders: rampingRate(steps[0], stages),
    probe: probeScenario(`${total}s`),
  },
  thresholds,
});

export function setup() {
  return setupRun();
}

export function order() {
  const step = stepOf(Date.now() - exec.scenario.startTime);
  const rate = step === 'ramp' ? steps[0] : Number(step);
  if (platform.unsettled() > rate * maxBacklogSeconds) {
    return;
  }
  placeOrder({ step });
}

export const probeLoop = taggedProbe((sinceStartMs) => ({ step: stepOf(sinceStartMs) }));

export function teardown(data) {
  // teardown has no scenario; the orders' start is the test's start, within
  // the few milliseconds between setup's end and the scenarios' start.
  const t0 = data.startedAt;
  audit(data, (placedMs) => ({ step: stepOf(placedMs - t0) }));
}

export function handleSummary(data) {
  const stepResults = steps.map((rate) => {
    const lag = data.metrics[`settle_lag{step:${rate}}`];
    const placed = data.metrics[`orders_placed{step:${rate}}`];
    const achieved = placed ? placed.values.count / hold : 0;
    const lagP99Ms = lag ? lag.values['p(99)'] : 0;
    const lagP50Ms = lag ? lag.values.med : 0;
    return { rate, achieved, lagP50Ms, lagP99Ms, ok: !!lag && lagP99Ms <= budgetMs && achieved >= 0.95 * rate };
  });
  // The knee: the highest rate reached without a failing step below it.
  let knee = 0;
  for (const s of stepResults) {
    if (!s.ok) {
      break;
    }
    knee = s.rate;
  }
  return summarize(report(data, 'ramp', total, { steps: stepResults, knee, lagBudgetMs: budgetMs }));
}
