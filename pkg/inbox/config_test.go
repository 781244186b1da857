package inbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []validateCase{
		{"name only takes the defaults", inbox.Config{Name: "c"}, ""},
		{"no name", inbox.Config{}, "Name is required"},
		{"negative workers", inbox.Config{Name: "c", Workers: -1}, "Workers is negative"},
		{"negative batch size", inbox.Config{Name: "c", BatchSize: -1}, "BatchSize is negative"},
		{"negative shutdown grace", inbox.Config{Name: "c", ShutdownGrace: -time.Second}, "ShutdownGrace is negative"},
		{"backoff bounds crossed", inbox.Config{Name: "c", BackoffMin: time.Minute}, "BackoffMin (1m0s) exceeds BackoffMax (5s)"},
	}
	checkValidateCases(t, tests)
}

// WithDefaults fills zeros with the defaults the fields' docs state and
// keeps negatives for Validate to refuse.
func TestWithDefaultsUsesTheDocumentedDefaultsAndKeepsNegatives(t *testing.T) {
	t.Parallel()
	d := lease.Config{Config: inbox.Config{Name: "c", Workers: -1}}.WithDefaults()
	if d.Workers != -1 || d.BatchSize != 100 || d.MaxAttempts != 5 ||
		d.ShutdownGrace != 10*time.Second {
		t.Fatalf("Config defaults: Workers %d, BatchSize %d, MaxAttempts %d, ShutdownGrace %v", d.Workers, d.BatchSize, d.MaxAttempts, d.ShutdownGrace)
	}
	if d.LeaseTTL != 30*time.Second || d.CallTimeout != 10*time.Second || d.LeaseMargin != 3*time.Second ||
		d.MaxInFlight != 16 || !strings.HasPrefix(d.LeaseOwner, "c-") {
		t.Fatalf("lease defaults: %v %v %v %d %q", d.LeaseTTL, d.CallTimeout, d.LeaseMargin, d.MaxInFlight, d.LeaseOwner)
	}
	g := inbox.GroupConfig{CommitInterval: -1}.WithDefaults()
	if g.CommitInterval != -1 || g.SessionTimeout != 10*time.Second || g.MaxWait != 500*time.Millisecond {
		t.Fatalf("GroupConfig defaults: CommitInterval %v, SessionTimeout %v, MaxWait %v", g.CommitInterval, g.SessionTimeout, g.MaxWait)
	}
	p := inbox.PrunerConfig{}.WithDefaults()
	if p.PruneConfig.Retention != 30*24*time.Hour || p.PruneConfig.BatchSize != 1000 || p.Interval != time.Hour {
		t.Fatalf("PrunerConfig defaults: %v %d %v", p.PruneConfig.Retention, p.PruneConfig.BatchSize, p.Interval)
	}
}

func TestGroupConfigValidate(t *testing.T) {
	t.Parallel()
	ok := inbox.GroupConfig{Brokers: []string{"b"}, Topic: "t", Group: "g"}
	with := func(f func(*inbox.GroupConfig)) inbox.GroupConfig { g := ok; f(&g); return g }
	tests := []validateCase{
		{"required fields take the defaults", ok, ""},
		{"no topic", with(func(g *inbox.GroupConfig) { g.Topic = "" }), "needs Brokers, Topic and Group"},
		{"negative session timeout", with(func(g *inbox.GroupConfig) { g.SessionTimeout = -time.Second }), "SessionTimeout is negative"},
		{"negative commit interval", with(func(g *inbox.GroupConfig) { g.CommitInterval = -1 }), "CommitInterval is negative"},
		{"heartbeat as long as the session", with(func(g *inbox.GroupConfig) { g.SessionTimeout = time.Second }), "HeartbeatInterval (1s) must be shorter than SessionTimeout (1s)"},
		{"unknown start offset", with(func(g *inbox.GroupConfig) { g.StartOffset = 42 }), "StartOffset is 42"},
		{"negative min bytes", with(func(g *inbox.GroupConfig) { g.MinBytes = -1 }), "MinBytes is negative"},
		{"min bytes above max bytes", with(func(g *inbox.GroupConfig) { g.MinBytes = 2 << 20; g.MaxBytes = 1 << 20 }), "MinBytes (2097152) exceeds MaxBytes (1048576)"},
		{"read backoffs the wrong way round", with(func(g *inbox.GroupConfig) { g.ReadBackoffMin = time.Second }), "ReadBackoffMin (1s) exceeds ReadBackoffMax (100ms)"},
		{"last offset", with(func(g *inbox.GroupConfig) { g.StartOffset = kafka.LastOffset }), ""},
	}
	checkValidateCases(t, tests)
}

// The listings take zero for their default limit and refuse a negative
// one, as the configurations do, before they touch Kafka or the database.
func TestListingsRefuseANegativeLimit(t *testing.T) {
	t.Parallel()
	_, err := inboxadmin.ListDeadLetters(context.Background(), []string{"127.0.0.1:1"}, "t.dlt", -1)
	testenv.CheckErr(t, err, "limit is negative (-1)")
	testenv.CheckErr(t, inboxadmin.ParkedFilter{Limit: -1}.Validate(), "limit must be from 1 to 1000")
	testenv.CheckErr(t, inboxadmin.ParkedFilter{Limit: 1001}.Validate(), "limit must be from 1 to 1000")
	testenv.CheckErr(t, inboxadmin.ParkedFilter{}.Validate(), "")
	_, err = inboxadmin.ListParked(context.Background(), testenv.LazyPool(t), inboxadmin.ParkedFilter{Limit: -1})
	testenv.CheckErr(t, err, "limit must be from 1 to 1000")
}

// NewConsumer refuses what Validate refuses, before it touches Kafka or
// the database.
func TestNewConsumerValidates(t *testing.T) {
	t.Parallel()
	src := inbox.GroupConfig{Brokers: []string{"127.0.0.1:1"}, Topic: "t", Group: "g"}
	h := func(context.Context, pgx.Tx, event.Envelope) error { return nil }
	_, err := inbox.NewConsumer(testenv.LazyPool(t), src, &kafka.Writer{}, h, inbox.Config{Name: "c", Workers: -2})
	testenv.CheckErr(t, err, "Workers is negative")
	eff := lease.Effect{Check: func(context.Context, string) (bool, error) { return false, nil },
		Call: func(context.Context, event.Envelope, string) error { return nil }}
	_, err = lease.NewConsumer(testenv.LazyPool(t), src, &kafka.Writer{}, eff, lease.Config{Config: inbox.Config{Name: "c"}, MaxInFlight: -1})
	testenv.CheckErr(t, err, "MaxInFlight is negative")
	src.HeartbeatInterval = time.Minute
	_, err = inbox.NewConsumer(testenv.LazyPool(t), src, &kafka.Writer{}, h, inbox.Config{Name: "c"})
	testenv.CheckErr(t, err, "HeartbeatInterval")
}

// validateCase is a configuration and what its Validate must say: "" for
// valid, else a substring of the error.
type validateCase struct {
	name string
	cfg  interface{ Validate() error }
	want string
}

// checkValidateCases checks each case in a parallel subtest.
func checkValidateCases(t *testing.T, tests []validateCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testenv.CheckErr(t, tt.cfg.Validate(), tt.want)
		})
	}
}
