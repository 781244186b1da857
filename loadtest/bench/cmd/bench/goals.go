package main

// The project's performance goals (issue 33), written down here and
// nowhere else: the headline of BENCHMARKS.md judges every run by them,
// the detail tables carry none, and the docs point to the page. A goal
// changes here, in one commit, or not at all; older runs in
// benchmarks/history keep the goals of their day.

// goal is one goal: how the headline states it and whether a value meets it.
type goal struct {
	text string
	met  func(float64) bool
}

func atLeast(limit float64) func(float64) bool { return func(v float64) bool { return v >= limit } }
func atMost(limit float64) func(float64) bool  { return func(v float64) bool { return v <= limit } }

var (
	// goalKnee: the ramp's knee, the highest step whose commit →
	// settlement p99 stays within 100 ms with ≥ 95 % of the offered rate
	// placed, on two cores with k6 beside.
	goalKnee = goal{"≥ 700 orders/s", atLeast(700)}
	// goalKneeOfBound: the knee over the CPU bound of the same run
	// (cpuBound), so a slower or busier machine moves both alike: a knee
	// far below the bound is set by waiting, not by work.
	goalKneeOfBound = goal{"≥ 0.75 of the CPU bound", atLeast(0.75)}
	// goalSettledAt2000: settlements per second at the ramp's 2,000 step.
	goalSettledAt2000 = goal{"≥ 1,500 orders/s", atLeast(1500)}
	// goalCPUPrograms and goalCPUAllButK6: CPU per order at the ramp's
	// 1,000 step, the four programs and everything but k6 (+ Postgres,
	// Kafka); with -base also as a ratio against the base.
	goalCPUPrograms = goal{"≤ 600 µs", atMost(600)}
	goalCPUAllButK6 = goal{"≤ 1,200 µs", atMost(1200)}
	// goalPollDrain and goalTableDrain: a 100,000-event backlog drained
	// by the polling relay, and by the log-based relay in table mode
	// (RELAY_MODE=cdc), over raw kafka-go produce of the same messages.
	goalPollDrain  = goal{"ratio ≥ 0.40", atLeast(0.40)}
	goalTableDrain = goal{"ratio ≥ 0.60", atLeast(0.60)}
	// goalPeersCPU: the log-based relay's process CPU per event over
	// Debezium's, at each of peersGoalRates, in the same peers run; both
	// modes (table and WAL-only) must meet it.
	goalPeersCPU = goal{"≤ 0.50× Debezium's", atMost(0.50)}
	// goalNoneLost: settlements lost plus duplicated over every k6 run.
	goalNoneLost = goal{"0 / 0", func(v float64) bool { return v == 0 }}
)

// peersGoalRates are the paced rates, events/s, goalPeersCPU is judged at
// (the peers part's default -peers-rates).
var peersGoalRates = []int{200, 1000, 5000}

// cpuBoundRate is the ramp step whose CPU per order sets the CPU bound.
const cpuBoundRate = 1000

// cpuBound is the orders per second the machine's CPUs could carry at
// most: every CPU's second of CPU time divided by the CPU one order costs
// everything on the machine, k6 included, at the ramp's 1,000 step (per
// CPU per order falls a little as the rate rises, so this slightly
// underestimates the bound above 1,000). 0 without that step.
func cpuBound(w Window, cpus int) float64 {
	all, ok1 := w.CPUPerOrderUs[cpuAllButK6]
	k6, ok2 := w.CPUPerOrderUs["k6"]
	if !ok1 || !ok2 || all+k6 <= 0 || cpus < 1 {
		return 0
	}
	return float64(cpus) * 1e6 / (all + k6)
}
