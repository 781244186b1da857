package inbox

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the consumers' Prometheus metrics, labelled by consumer name.
// Create them once per process and share them between its consumers.
type Metrics struct {
	processed, duplicates, stale, failures, gaps, uncertain *prometheus.CounterVec
	deadLettered                                            *prometheus.CounterVec // consumer, reason
	seconds                                                 *prometheus.HistogramVec
	lag, deadLetters                                        *prometheus.GaugeVec
	kafkaErrors, dbErrors                                   *prometheus.CounterVec // consumer, op
	kafkaConnected, dbConnected                             *prometheus.GaugeVec
}

// The reason label of inbox_dead_lettered_total: why a message went to the
// dead-letter topic, in classes few enough to alert on (the full error is in
// the message's dlt-reason header and the inbox row's last_error).
const (
	// ReasonUndecodable: the message is not an event envelope.
	ReasonUndecodable = "undecodable"
	// ReasonInvalid: the envelope or payload broke the contract (event.ErrInvalid).
	ReasonInvalid = "invalid"
	// ReasonPermanent: the handler said retrying cannot help (Permanent).
	ReasonPermanent = "permanent"
	// ReasonExhausted: a transient failure outlasted MaxAttempts.
	ReasonExhausted = "exhausted"
)

var deadLetterReasons = []string{ReasonUndecodable, ReasonInvalid, ReasonPermanent, ReasonExhausted}

// NewMetrics creates the consumer metrics and registers them on reg (nil:
// not registered, for tests and tools).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"consumer"})
	}
	m := &Metrics{
		processed:  counter("inbox_processed_total", "Events handled and committed with their inbox row."),
		duplicates: counter("inbox_duplicates_total", "Redelivered events acknowledged without running the handler."),
		stale:      counter("inbox_stale_total", "Events at or below the aggregate version already applied, skipped."),
		failures:   counter("inbox_failures_total", "Handler attempts that failed (each retry counts)."),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_dead_lettered_total",
			Help: "Messages sent to the dead-letter topic, by reason (undecodable, invalid, permanent, exhausted).",
		}, []string{"consumer", "reason"}),
		gaps:      counter("inbox_version_gaps_total", "Events whose aggregate version skipped one or more versions."),
		uncertain: counter("inbox_uncertain_total", "Leased messages whose side effect may or may not have happened; see the reconciliation report."),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inbox_processing_seconds",
			Help:    "Time to handle one message, its share of the batch transaction included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"consumer"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "consumer_lag_messages",
			Help: "Messages in the partition after the consumer group's committed offset.",
		}, []string{"consumer", "topic", "partition"}),
		deadLetters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inbox_dead_letters",
			Help: "Dead-lettered events not requeued yet: the dead-letter backlog an operator has to resolve (refreshed every LagInterval).",
		}, []string{"consumer"}),
		kafkaErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_kafka_errors_total",
			Help: "Failed Kafka operations of the consumer, by op (join, fetch, commit, dead_letter); retried, never charged to a message.",
		}, []string{"consumer", "op"}),
		dbErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_database_errors_total",
			Help: "Database operations that failed because the database was unreachable, by op; waited out, never charged to a message.",
		}, []string{"consumer", "op"}),
		kafkaConnected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inbox_kafka_connected",
			Help: "1 while the consumer reaches Kafka, 0 during an outage it is waiting out.",
		}, []string{"consumer"}),
		dbConnected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inbox_database_connected",
			Help: "1 while the consumer reaches its database, 0 during an outage it is waiting out.",
		}, []string{"consumer"}),
	}
	if reg != nil {
		reg.MustRegister(m.processed, m.duplicates, m.stale, m.failures, m.deadLettered, m.gaps, m.uncertain, m.seconds, m.lag, m.deadLetters,
			m.kafkaErrors, m.dbErrors, m.kafkaConnected, m.dbConnected)
	}
	return m
}

// record counts one committed batch of n messages. Dead letters are counted
// by deadLetter itself, with their reason, when the dead-letter topic has them.
func (m *Metrics) record(consumer string, counts [4]int, n int, took time.Duration) {
	m.processed.WithLabelValues(consumer).Add(float64(counts[processed]))
	m.duplicates.WithLabelValues(consumer).Add(float64(counts[duplicate]))
	m.stale.WithLabelValues(consumer).Add(float64(counts[stale]))
	if n > 0 {
		per := took.Seconds() / float64(n)
		h := m.seconds.WithLabelValues(consumer)
		for range n {
			h.Observe(per)
		}
	}
}

// KafkaErrors returns the inbox_kafka_errors_total counter of consumer and
// op, for tests that wait on it.
func (m *Metrics) KafkaErrors(consumer, op string) prometheus.Counter {
	return m.kafkaErrors.WithLabelValues(consumer, op)
}

// Duplicates returns the duplicates counter of consumer, for tests and
// examples that wait on it.
func (m *Metrics) Duplicates(consumer string) prometheus.Counter {
	return m.duplicates.WithLabelValues(consumer)
}

// init exports every series of consumer at zero, so dashboards and alerts
// see the metrics before the first event arrives.
func (m *Metrics) init(consumer string) {
	for _, c := range []*prometheus.CounterVec{m.processed, m.duplicates, m.stale, m.failures, m.gaps, m.uncertain} {
		c.WithLabelValues(consumer)
	}
	for _, r := range deadLetterReasons {
		m.deadLettered.WithLabelValues(consumer, r)
	}
	m.seconds.WithLabelValues(consumer)
	m.deadLetters.WithLabelValues(consumer)
	// The ops every consumer runs, so that rate() of the error counters has
	// a series before the first outage; rarer ops appear when they fail.
	for _, op := range []string{"join", "fetch", "commit", "dead_letter"} {
		m.kafkaErrors.WithLabelValues(consumer, op)
	}
	for _, op := range []string{"begin", "commit"} {
		m.dbErrors.WithLabelValues(consumer, op)
	}
}
