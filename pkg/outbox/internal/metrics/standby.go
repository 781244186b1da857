package metrics

import "github.com/prometheus/client_golang/prometheus"

// Standby are the metrics of the waits for the standbys.
type Standby struct {
	Waits  *prometheus.CounterVec
	Waited prometheus.Histogram
	Behind prometheus.Gauge
}

func newStandby(reg prometheus.Registerer) *Standby {
	m := &Standby{
		Waits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_standby_waits_total",
			Help: "Waits of a relay with PublishReplicated for the standbys to flush what it is about to publish, by outcome: " +
				"at_once (they had it), waited, timeout (ReplicatedWait ran out: nothing published, retried; a standby outage)."},
			[]string{"outcome"}),
		Waited: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_standby_wait_seconds",
			Help:    "How long a relay with PublishReplicated waited for the standbys before publishing (0 when they had it).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		Behind: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_standby_behind",
			Help: "1 while a relay with PublishReplicated publishes nothing because its last wait for the standbys ran out " +
				"(a standby down, behind, or no standby slot), 0 otherwise."}),
	}
	for _, o := range []string{"at_once", "waited", "timeout"} {
		m.Waits.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(m.Waits, m.Waited, m.Behind)
	}
	return m
}
