package orders

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the business counters of the orders service: the demand the
// rest of the platform has to carry, counted after the commit.
type Metrics struct {
	placed, cancelled prometheus.Counter
}

// NewMetrics creates the orders metrics and registers them on reg (nil: not
// registered, for tests and tools).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		placed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orders_placed_total",
			Help: "Orders placed and committed with their OrderPlaced event (an idempotent replay does not count).",
		}),
		cancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orders_cancelled_total",
			Help: "Orders cancelled and committed with their OrderCancelled event (cancelling a cancelled order does not count).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.placed, m.cancelled)
	}
	return m
}

// WithMetrics makes s count what it commits on m, and returns s.
func (s *Service) WithMetrics(m *Metrics) *Service {
	s.metrics = m
	return s
}
