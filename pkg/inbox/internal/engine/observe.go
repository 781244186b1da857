// What the engine reports: its metrics and the spans around each message.

package engine

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"
)

// Metrics are the consumers' Prometheus metrics, labelled by consumer name.
// Create them once per process and share them between its consumers.
type Metrics struct {
	processed, duplicates, stale, failures, gaps, uncertain *prometheus.CounterVec
	parked, released                                        *prometheus.CounterVec
	payloadMismatches                                       *prometheus.CounterVec
	refused                                                 *prometheus.CounterVec // consumer, transition
	deadLettered                                            *prometheus.CounterVec // consumer, reason
	seconds, batchSeconds, hop                              *prometheus.HistogramVec
	lag, deadLetters, parkedNow                             *prometheus.GaugeVec
	strandedHolds, oldestHold, pastRetention                *prometheus.GaugeVec
	operatorActions                                         *prometheus.GaugeVec   // consumer, action
	kafkaErrors, dbErrors, standbyErrors                    *prometheus.CounterVec // consumer, op
	kafkaConnected, dbConnected, standbyConnected           *prometheus.GaugeVec
	effectErrors                                            *prometheus.CounterVec // consumer, op (lease mode)
	effectConnected                                         *prometheus.GaugeVec   // lease mode
	serverSwitches                                          *prometheus.CounterVec // lease mode
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
	// ReasonExhausted: a transient failure outlasted MaxAttempts (a version
	// gap that was never filled among them, AcceptGaps false).
	ReasonExhausted = "exhausted"
	// ReasonStale: an older event arrived after a newer one of its
	// aggregate was applied (SkipStale false).
	ReasonStale = "stale"
)

var deadLetterReasons = []string{ReasonUndecodable, ReasonInvalid, ReasonPermanent, ReasonExhausted, ReasonStale}

// NewMetrics creates the consumer metrics and registers them on reg (nil:
// not registered, for tests and tools).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	// Every series is labelled by consumer, then by labels.
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"consumer"}, labels...))
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, append([]string{"consumer"}, labels...))
	}
	histogram := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, []string{"consumer"})
	}
	m := &Metrics{
		processed:  counter("inbox_processed_total", "Events handled and committed with their inbox row."),
		duplicates: counter("inbox_duplicates_total", "Redelivered events acknowledged without running the handler."),
		stale:      counter("inbox_stale_total", "Events at or below the aggregate version already applied, skipped."),
		payloadMismatches: counter("inbox_payload_mismatches_total",
			"Redelivered events whose payload differs from the one first handled under the same event id (a producer bug); ignored like any duplicate."),
		failures: counter("inbox_failures_total", "Handler attempts that failed (each retry counts)."),
		parked: counter("inbox_parked_total",
			"Events parked, not applied, because an earlier event of their aggregate is dead (dead-lettered and not yet requeued and applied)."),
		released: counter("inbox_released_total", "Parked events released from the parking once the dead event ahead of them was requeued and applied."),
		deadLettered: counter("inbox_dead_lettered_total",
			"Messages sent to the dead-letter topic, by reason (undecodable, invalid, permanent, exhausted, stale).", "reason"),
		refused: counter("inbox_transitions_refused_total",
			"Lifecycle transitions a writer tried after losing its right (the row had moved on: settled by another member, a lease taken over); each changed nothing (state.go).", "transition"),
		gaps:      counter("inbox_version_gaps_total", "Events whose aggregate version skipped one or more versions."),
		uncertain: counter("inbox_uncertain_total", "Leased messages whose side effect may or may not have happened; see the reconciliation report."),
		serverSwitches: counter("inbox_server_switches_total",
			"Times the consumer found its database on another server than the one it recorded (a failover, a restore, a restart). Lease mode: first deliveries of older messages then check before calling (lease/lease_server.go). Config.CommitReplicated: the offsets of the work done on the old server are dropped, uncommitted, and the consumer rejoins its group to read them again (consume.go)."),
		seconds: histogram("inbox_processing_seconds",
			"Time to handle one message in a transaction of its own (a retry, lease mode, a batch of one), commit included.",
			prometheus.ExponentialBuckets(0.0001, 2, 16)),
		batchSeconds: histogram("inbox_batch_seconds",
			"Time to handle one batch of messages in one transaction, commit included; observed once per batch, whatever its size.",
			prometheus.ExponentialBuckets(0.0001, 2, 18)),
		hop: histogram("inbox_hop_seconds",
			"From the event's occurredAt (its producer's commit) to the start of its handler (lease mode: its side effect): the hop through the outbox relay, Kafka and the consumer. Observed once per first run of the handler.",
			// 0.5 ms to ~13 s, steps of 1.5x: fine enough to tell 5 ms from 10 ms.
			prometheus.ExponentialBuckets(0.0005, 1.5, 26)),
		lag: gauge("consumer_lag_messages",
			"Messages in the partition after the consumer group's committed offset.", "topic", "partition"),
		deadLetters: gauge("inbox_dead_letters",
			"Dead-lettered events not requeued yet: the dead-letter backlog an operator has to resolve (refreshed every LagInterval)."),
		parkedNow: gauge("inbox_parked_messages",
			"Events parked behind a dead event of their aggregate, waiting for its requeue (refreshed every LagInterval)."),
		strandedHolds: gauge("inbox_stranded_holds",
			"Held aggregates with no requeueable dead letter behind them: the dead event's row is neither dead_lettered nor freshly requeued (its requeued copy never applied within 5 minutes). Needs ReleaseHeld or SkipHeld (refreshed every LagInterval)."),
		oldestHold: gauge("inbox_oldest_hold_age_seconds",
			"Age of the oldest hold of an aggregate behind a dead event; past the dead-letter topic's retention its letter is gone and only ReleaseHeld or SkipHeld can free it (refreshed every LagInterval)."),
		pastRetention: gauge("inbox_holds_past_dead_letter_retention",
			"Holds whose dead letter is only in the dead-letter topic and older than Config.DeadLetterRetention: the letter is most likely gone, its row still says dead_lettered, and only ReleaseHeld or SkipHeld can free the aggregate (refreshed every LagInterval)."),
		operatorActions: gauge("inbox_operator_actions",
			"Operator releases and skips of held aggregates recorded in inbox_operator_actions, by action (refreshed every LagInterval).", "action"),
		kafkaErrors: counter("inbox_kafka_errors_total",
			"Failed Kafka operations of the consumer, by op (join, fetch, commit, dead_letter); retried, never charged to a message.", "op"),
		dbErrors: counter("inbox_database_errors_total",
			"Database operations that failed because the database was unreachable, by op; waited out, never charged to a message.", "op"),
		kafkaConnected: gauge("inbox_kafka_connected",
			"1 while the consumer reaches Kafka, 0 during an outage it is waiting out."),
		dbConnected: gauge("inbox_database_connected",
			"1 while the consumer reaches its database, 0 during an outage it is waiting out."),
		standbyErrors: counter("inbox_standby_errors_total",
			"Config.CommitReplicated: offset commits held back because the standbys had not flushed the consumer's work within CommitInterval, or their position could not be read, by op (commit); the offsets are committed once they have.", "op"),
		standbyConnected: gauge("inbox_standby_connected",
			"Config.CommitReplicated: 1 while the standbys keep up with the consumer's work, 0 while its offset commits wait for them."),
		effectErrors: counter("inbox_effect_errors_total",
			"Lease mode: Effect calls that found the other side (a third party) unavailable, by op (check, call); waited out, never charged to a message.", "op"),
		effectConnected: gauge("inbox_effect_connected",
			"Lease mode: 1 while the other side of the Effect (a third party) answers, 0 during an outage the consumer is waiting out."),
	}
	if reg != nil {
		reg.MustRegister(m.effectErrors, m.effectConnected, m.serverSwitches)
		reg.MustRegister(m.processed, m.duplicates, m.stale, m.failures, m.deadLettered, m.gaps, m.uncertain, m.payloadMismatches, m.seconds, m.batchSeconds, m.hop, m.lag, m.deadLetters,
			m.parked, m.released, m.parkedNow, m.refused, m.strandedHolds, m.oldestHold, m.pastRetention, m.operatorActions,
			m.kafkaErrors, m.dbErrors, m.kafkaConnected, m.dbConnected, m.standbyErrors, m.standbyConnected)
	}
	return m
}

// record counts one committed batch of n messages, which took took. The
// batch's time is observed once, in inbox_batch_seconds; only a message
// handled alone (n == 1) is also a per-message observation: splitting a
// batch's time evenly among its messages would invent durations no message
// had, and weigh big batches n times. Dead letters are counted by deadLetter
// itself, with their reason, when the dead-letter topic has them.
func (m *Metrics) record(consumer string, counts [NumOutcomes]int, n int, took time.Duration) {
	m.processed.WithLabelValues(consumer).Add(float64(counts[Processed]))
	m.duplicates.WithLabelValues(consumer).Add(float64(counts[Duplicate]))
	m.stale.WithLabelValues(consumer).Add(float64(counts[Stale]))
	m.parked.WithLabelValues(consumer).Add(float64(counts[ParkedOutcome]))
	if n > 0 {
		m.batchSeconds.WithLabelValues(consumer).Observe(took.Seconds())
	}
	if n == 1 {
		m.seconds.WithLabelValues(consumer).Observe(took.Seconds())
	}
}

// observeHop records the hop of an event whose handler starts now. The
// hop is measured from the envelope's occurredAt rather than the Kafka
// message's timestamp: occurredAt is set in the producer's transaction, so
// the hop covers what a user waits for — the relay's pick-up and publish,
// Kafka, and the consumer's fetch and dispatch — the same way whichever
// relay (polling or log-based) published the event; the Kafka timestamp
// would leave the relay out. Both are read against another process's
// clock, so across hosts the hop includes their clock skew; a negative
// one counts as zero.
func (m *Metrics) observeHop(consumer string, occurredAt time.Time) {
	m.hop.WithLabelValues(consumer).Observe(max(time.Since(occurredAt).Seconds(), 0))
}

// KafkaErrors returns the inbox_kafka_errors_total counter of consumer and
// op, for tests that wait on it.
func (m *Metrics) KafkaErrors(consumer, op string) prometheus.Counter {
	return m.kafkaErrors.WithLabelValues(consumer, op)
}

// init exports every series of consumer at zero, so dashboards and alerts
// see the metrics before the first event arrives.
func (m *Metrics) init(consumer string) {
	for _, c := range []*prometheus.CounterVec{m.processed, m.duplicates, m.stale, m.failures, m.gaps, m.uncertain, m.payloadMismatches, m.parked, m.released} {
		c.WithLabelValues(consumer)
	}
	for _, tr := range state.Lifecycle {
		if tr.By == state.ByWorker || tr.By == state.ByHolder {
			m.refused.WithLabelValues(consumer, tr.Name)
		}
	}
	for _, r := range deadLetterReasons {
		m.deadLettered.WithLabelValues(consumer, r)
	}
	m.seconds.WithLabelValues(consumer)
	m.batchSeconds.WithLabelValues(consumer)
	m.hop.WithLabelValues(consumer)
	m.deadLetters.WithLabelValues(consumer)
	m.parkedNow.WithLabelValues(consumer)
	m.strandedHolds.WithLabelValues(consumer)
	m.oldestHold.WithLabelValues(consumer)
	m.pastRetention.WithLabelValues(consumer)
	for _, a := range []string{state.ActionRelease, state.ActionSkip} {
		m.operatorActions.WithLabelValues(consumer, a)
	}
	// The ops every consumer runs, so that rate() of the error counters has
	// a series before the first outage; rarer ops appear when they fail.
	for _, op := range []string{"join", "fetch", "commit", "dead_letter"} {
		m.kafkaErrors.WithLabelValues(consumer, op)
	}
	for _, op := range []string{"begin", "commit"} {
		m.dbErrors.WithLabelValues(consumer, op)
	}
}

// The consumer's metrics that pkg/inbox/lease moves, reached through
// functions rather than methods so that Metrics, which pkg/inbox exports,
// shows an adopter nothing more. NewMetrics registers them with the rest,
// whichever mode runs, so that a dashboard finds every series.

// Record is m.record, for the lease applier.
func Record(m *Metrics, consumer string, counts [NumOutcomes]int, n int, took time.Duration) {
	m.record(consumer, counts, n, took)
}

// ObserveHop is m.observeHop, for the lease applier.
func ObserveHop(m *Metrics, consumer string, occurredAt time.Time) {
	m.observeHop(consumer, occurredAt)
}

// Failures is inbox_failures_total.
func Failures(m *Metrics) *prometheus.CounterVec { return m.failures }

// Uncertain is inbox_uncertain_total.
func Uncertain(m *Metrics) *prometheus.CounterVec { return m.uncertain }

// ServerSwitches is inbox_server_switches_total.
func ServerSwitches(m *Metrics) *prometheus.CounterVec { return m.serverSwitches }

// EffectErrors is inbox_effect_errors_total, by consumer and op.
func EffectErrors(m *Metrics) *prometheus.CounterVec { return m.effectErrors }

// EffectConnected is inbox_effect_connected.
func EffectConnected(m *Metrics) *prometheus.GaugeVec { return m.effectConnected }

// tracerScope names the consumer's spans (the instrumentation scope).
const tracerScope = "github.com/onceflow/onceflow/pkg/inbox"

// StartProcess starts the consumer span of one message: a child of the
// trace context in its traceparent header (the producer's span), so the
// trace goes on from the service that published the event. The handler's
// ctx carries the span: events it enqueues store its traceparent, and calls
// it makes continue the trace. Spans come from the process-wide tracer
// provider (tracing.Setup); without one they are no-ops that pass the
// header's context on unchanged.
func (s *Shared) StartProcess(ctx context.Context, m kafka.Message, ev event.Envelope) (context.Context, trace.Span) {
	return otel.GetTracerProvider().Tracer(tracerScope).Start(event.ContextWithTraceparent(ctx, ev.Traceparent),
		"process "+m.Topic, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
			semconv.MessagingSystemKafka, semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"), semconv.MessagingDestinationName(m.Topic),
			semconv.MessagingConsumerGroupName(s.Config.Name), semconv.MessagingMessageID(ev.EventID.String()),
			semconv.MessagingKafkaMessageKey(string(m.Key)), semconv.MessagingKafkaOffset(int(m.Offset)),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(m.Partition)),
			attribute.String("onceflow.event_type", ev.EventType)))
}
