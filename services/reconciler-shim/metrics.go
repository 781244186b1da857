package shim

import (
	"context"
	"errors"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// Metrics are the shim's own metrics, beside the inbox's: what the third
// party confirmed, how it failed, and how long a payment took from the
// orders commit to its settlement.
type Metrics struct {
	forwards, errors *prometheus.CounterVec
	lag              *prometheus.HistogramVec
}

// The op label of shim_thirdparty_errors_total.
const (
	OpSettle = "settle"
	OpLookup = "lookup"
)

// The kind label of shim_thirdparty_errors_total.
const (
	// ErrorRejected: a 4xx answer; retrying the same request cannot help.
	ErrorRejected = "rejected"
	// ErrorStatus: any other non-2xx answer (5xx, 429): the third party is failing.
	ErrorStatus = "status"
	// ErrorTimeout: no answer in time; the call may still have landed.
	ErrorTimeout = "timeout"
	// ErrorTransport: no answer at all (refused, reset, DNS).
	ErrorTransport = "transport"
)

// NewMetrics creates the shim metrics and registers them on reg (nil: not
// registered, for tests and tools).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		forwards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shim_forwards_total",
			Help: "Payments recorded as settled at the third party, by kind (capture, refund) and outcome (sent; already_present: an earlier attempt had landed).",
		}, []string{"kind", "outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shim_thirdparty_errors_total",
			Help: "Failed calls to the third-party reconciler, by op (settle, lookup) and kind (rejected, status, timeout, transport).",
		}, []string{"op", "kind"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shim_settlement_lag_seconds",
			Help:    "From the orders commit (the order event's occurredAt) to the settlement recorded at the third party.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 15),
		}, []string{"kind"}),
	}
	for _, kind := range []string{thirdparty.KindCapture, thirdparty.KindRefund} {
		for _, outcome := range []string{"sent", "already_present"} {
			m.forwards.WithLabelValues(kind, outcome)
		}
		m.lag.WithLabelValues(kind)
	}
	for _, op := range []string{OpSettle, OpLookup} {
		for _, kind := range []string{ErrorRejected, ErrorStatus, ErrorTimeout, ErrorTransport} {
			m.errors.WithLabelValues(op, kind)
		}
	}
	if reg != nil {
		reg.MustRegister(m.forwards, m.errors, m.lag)
	}
	return m
}

// callError counts err, when not nil, as a failed op, and returns it.
func (m *Metrics) callError(op string, err error) error {
	if err == nil {
		return nil
	}
	var (
		se  *thirdparty.StatusError
		ne  net.Error
		why = ErrorTransport
	)
	switch {
	case errors.Is(err, thirdparty.ErrRejected):
		why = ErrorRejected
	case errors.As(err, &se):
		why = ErrorStatus
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		why = ErrorTimeout
	}
	m.errors.WithLabelValues(op, why).Inc()
	return err
}
