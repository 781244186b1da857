package prune_test

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Both libraries' pruners refuse the same mistakes, in Validate and again
// in NewPruner, before it touches the database; NewPruner also refuses a
// missing database.
func TestPrunerConfigs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		retention time.Duration
		batchSize int
		interval  time.Duration
		want      string
	}{
		{"zero takes the defaults", 0, 0, 0, ""},
		{"negative retention", -time.Hour, 0, 0, "Retention is negative (-1h0m0s)"},
		{"negative batch size", 0, -1, 0, "BatchSize is negative"},
		{"negative interval", 0, 0, -time.Minute, "Interval is negative"},
	} {
		t.Run("inbox/"+c.name, func(t *testing.T) {
			t.Parallel()
			cfg := inbox.PrunerConfig{PruneConfig: inbox.PruneConfig{Retention: c.retention, BatchSize: c.batchSize}, Interval: c.interval}
			testenv.CheckErr(t, cfg.Validate(), c.want)
			_, err := inbox.NewPruner(testenv.LazyPool(t), cfg)
			testenv.CheckErr(t, err, c.want)
		})
		t.Run("outbox/"+c.name, func(t *testing.T) {
			t.Parallel()
			cfg := outbox.PrunerConfig{PruneConfig: outbox.PruneConfig{Retention: c.retention, BatchSize: c.batchSize}, Interval: c.interval}
			testenv.CheckErr(t, cfg.Validate(), c.want)
			_, err := outbox.NewPruner(testenv.LazyPool(t), cfg)
			testenv.CheckErr(t, err, c.want)
		})
	}
	if _, err := inbox.NewPruner(nil, inbox.PrunerConfig{}); err == nil {
		t.Error("inbox.NewPruner(nil) returned no error")
	}
	if _, err := outbox.NewPruner(nil, outbox.PrunerConfig{}); err == nil {
		t.Error("outbox.NewPruner(nil) returned no error")
	}
}
