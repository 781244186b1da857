// Package testinfra is the platform's test infrastructure: the programs run
// in-process (Start), their logged addresses and JSON endpoints, an OTLP
// receiver. The servers themselves — a fresh database cloned from a migrated
// template, a fresh topic, waiting with a deadline, metrics, proxies that
// cut a connection — come from the libraries' pkg/testenv, found through
// ONCEFLOW_TEST_PG_URL and ONCEFLOW_TEST_KAFKA_BROKERS; the names below hand
// them on, so the platform's tests and the libraries' share one
// implementation.
package testinfra

import (
	"testing"

	"github.com/onceflow/onceflow/pkg/testenv"
	"github.com/onceflow/onceflow/platform/pgutil"
)

// The trace context a caller sends in the tests (testenv.CallerTraceparent).
const (
	CallerTraceID     = testenv.CallerTraceID
	CallerSpanID      = testenv.CallerSpanID
	CallerTraceparent = testenv.CallerTraceparent
)

// Proxy forwards a loopback port to a real server (testenv.Proxy).
type Proxy = testenv.Proxy

// The servers of the tests, from package testenv.
var (
	PostgresAdminURL   = testenv.PostgresAdminURL
	KafkaBrokers       = testenv.KafkaBrokers
	Name               = testenv.Name
	NewDatabase        = testenv.NewDatabase
	NewPool            = testenv.NewPool
	NewTopic           = testenv.NewTopic
	NewTopicNamed      = testenv.NewTopicNamed
	WaitFor            = testenv.WaitFor
	MetricValue        = testenv.MetricValue
	LabeledMetricValue = testenv.LabeledMetricValue
	ClosedAddr         = testenv.ClosedAddr
	CallJSON           = testenv.CallJSON
	NewProxy           = testenv.NewProxy
	ProxyDatabase      = testenv.ProxyDatabase
	RecordSpans        = testenv.RecordSpans
	ReadEvents         = testenv.ReadEvents
	RunInBackground    = testenv.RunInBackground
)

// NewMigratedDatabase is testenv.NewMigratedDatabase for the services'
// migration sets: a fresh database cloned from a template migrated once.
func NewMigratedDatabase(t testing.TB, sets ...pgutil.Migration) string {
	t.Helper()
	ms := make([]testenv.Migration, len(sets))
	for i, s := range sets {
		ms[i] = testenv.Migration{FS: s.FS, Table: s.Table}
	}
	return testenv.NewMigratedDatabase(t, ms...)
}
