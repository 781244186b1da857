package reconcile

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the gauges a report is published as; the reconciliation alerts
// (dashboards/alerts/reconcile.yml) and the overview dashboard read them.
// The label naming the service whose data has a finding is "component",
// not "service": Prometheus puts service on every target (this one's is
// "reconcile"), and a metric label of the same name would be renamed.
type Metrics struct {
	findings    *prometheus.GaugeVec
	oldest      *prometheus.GaugeVec
	lastSuccess prometheus.Gauge
	failures    prometheus.Counter
}

// NewMetrics registers the gauges with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		findings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "reconcile_findings",
			Help: "Inconsistencies the last reconciliation found, by kind and the component whose data has them.",
		}, []string{"kind", "component"}),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "reconcile_oldest_age_seconds",
			Help: "Age of the oldest inconsistency of each kind at the last reconciliation (0 when none).",
		}, []string{"kind", "component"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "reconcile_last_success_timestamp_seconds",
			Help: "When the last reconciliation completed; a stale value means the gauges are stale too.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reconcile_failures_total",
			Help: "Reconciliation runs that could not read a source.",
		}),
	}
	reg.MustRegister(m.findings, m.oldest, m.lastSuccess, m.failures)
	return m
}

// Observe publishes rep: every check's gauges, zero for the clean ones, so
// an alert clears when its finding is gone.
func (m *Metrics) Observe(rep Report) {
	for _, f := range rep.Findings {
		m.findings.WithLabelValues(f.Kind, f.Component).Set(float64(f.Count))
		m.oldest.WithLabelValues(f.Kind, f.Component).Set(f.OldestAge.Seconds())
	}
	m.lastSuccess.Set(float64(rep.At.Unix()))
}

// Failed counts a run that returned an error; the gauges keep their last
// values, and reconcile_last_success_timestamp_seconds ages.
func (m *Metrics) Failed() { m.failures.Inc() }
