// Spike: a calm baseline, a sudden burst, and the way back. BASE_RATE
// orders/s (default 100) for 15 s, SPIKE_RATE (default 1000) for
// SPIKE_DURATION (default 10s), then the baseline again for 30 s. Lag is
// tagged by the phase its order was placed in (before, spike, after), so the
// report shows how far the lag climbed and whether the platform recovered.
//
//   bin/k6 run -e SPIKE_RATE=1500 loadtest/k6/spike.js
import exec from 'k6/execution';
import { audit, placeOrder, probeScenario, rampingRate, report, seconds, setupRun, summarize, taggedProbe, withDefaults } from './lib.js';

const base = Number(__ENV.BASE_RATE || 100);
const spike = Number(__ENV.SPIKE_RATE || 1000);
const spikeDuration = __ENV.SPIKE_DURATION || '10s';
const before = 15;
const after = 30;
const total = before + seconds(spikeDuration) + after;

function phaseOf(sinceStartMs) {
  const t = sinceStartMs / 1000;
  if (t < before) {
    return 'before';
  }
  return t < before + seconds(spikeDuration) ? 'spike' : 'after';
}

const thresholds = {};
for (const phase of ['before', 'spike', 'after']) {
  // Always true: they make k6 keep each phase's lag for the report.
  thresholds[`settle_lag{phase:${phase}}`] = ['max>=0'];
}

export const options = withDefaults({
  scenarios: {
    orders: rampingRate(base, [
      { duration: `${before}s`, target: base },
      { duration: '0s', target: spike },
      { duration: spikeDuration, target: spike },
      { duration: '0s', target: base },
      { duration: `${after}s`, target: base },
    ]),
    probe: probeScenario(`${total}s`),
  },
  thresholds,
});

export function setup() {
  return setupRun();
}

export function order() {
  placeOrder({ phase: phaseOf(Date.now() - exec.scenario.startTime) });
}

export const probeLoop = taggedProbe((sinceStartMs) => ({ phase: phaseOf(sinceStartMs) }));

export function teardown(data) {
  audit(data, (placedMs) => ({ phase: phaseOf(placedMs - data.startedAt) }));
}

export function handleSummary(data) {
  const phases = {};
  for (const phase of ['before', 'spike', 'after']) {
    const m = data.metrics[`settle_lag{phase:${phase}}`];
    phases[phase] = m ? { lagP50Ms: m.values.med, lagP99Ms: m.values['p(99)'], lagMaxMs: m.values.max } : null;
  }
  return summarize(report(data, 'spike', total, { baseRate: base, spikeRate: spike, phases }));
}
