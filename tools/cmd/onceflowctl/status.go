package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Status is one service's backlog and lag as its /metrics reports them.
// A nil field is a metric the service does not export (orders has no
// inbox, the shim no outbox).
type Status struct {
	Service string `json:"service"`
	// Error is why the service could not be read; the other fields are nil.
	Error string `json:"error,omitempty"`
	// OutboxPending is outbox_pending_events.
	OutboxPending *float64 `json:"outboxPending,omitempty"`
	// OutboxOldestSeconds is outbox_oldest_pending_age_seconds.
	OutboxOldestSeconds *float64 `json:"outboxOldestPendingSeconds,omitempty"`
	// OutboxDead is outbox_dead_events.
	OutboxDead *float64 `json:"outboxDead,omitempty"`
	// ConsumerLag is consumer_lag_messages summed over topics and partitions.
	ConsumerLag *float64 `json:"consumerLag,omitempty"`
	// DeadLetters is inbox_dead_letters summed over consumers.
	DeadLetters *float64 `json:"deadLetters,omitempty"`
}

func (a *app) status(ctx context.Context, args []string) error {
	fs := newFlags("status", a.out)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var all []Status
	failed := 0
	for _, s := range a.services {
		st, err := a.scrape(ctx, s)
		if err != nil {
			st = Status{Service: s.name, Error: err.Error()}
			failed++
		}
		all = append(all, st)
	}
	if a.json {
		if err := a.writeJSON(all); err != nil {
			return err
		}
	} else {
		rows := make([][]string, 0, len(all))
		for _, st := range all {
			if st.Error != "" {
				rows = append(rows, []string{st.Service, "-", "-", "-", "-", "-", "unreachable: " + st.Error})
				continue
			}
			rows = append(rows, []string{st.Service, num(st.OutboxPending), seconds(st.OutboxOldestSeconds),
				num(st.OutboxDead), num(st.ConsumerLag), num(st.DeadLetters), health(st)})
		}
		if err := a.table([]string{"SERVICE", "OUTBOX PENDING", "OLDEST PENDING", "OUTBOX DEAD", "CONSUMER LAG", "DEAD LETTERS", "STATUS"}, rows); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d services could not be read", failed, len(all))
	}
	return nil
}

// scrape reads s's /metrics from its operator listener.
func (a *app) scrape(ctx context.Context, s service) (Status, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.admin+"/metrics", nil)
	if err != nil {
		return Status{}, err
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return Status{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Status{}, fmt.Errorf("GET %s/metrics: %s", s.admin, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return Status{}, fmt.Errorf("GET %s/metrics: %w", s.admin, err)
	}
	// Gauges every instance reports for the whole database take the max;
	// per-partition and per-consumer ones add up.
	return Status{
		Service:             s.name,
		OutboxPending:       aggregate(families["outbox_pending_events"], math.Max),
		OutboxOldestSeconds: aggregate(families["outbox_oldest_pending_age_seconds"], math.Max),
		OutboxDead:          aggregate(families["outbox_dead_events"], math.Max),
		ConsumerLag:         aggregate(families["consumer_lag_messages"], func(x, y float64) float64 { return x + y }),
		DeadLetters:         aggregate(families["inbox_dead_letters"], func(x, y float64) float64 { return x + y }),
	}, nil
}

func aggregate(mf *dto.MetricFamily, combine func(float64, float64) float64) *float64 {
	if mf == nil || len(mf.GetMetric()) == 0 {
		return nil
	}
	var v float64
	for i, m := range mf.GetMetric() {
		x := m.GetGauge().GetValue()
		if m.GetGauge() == nil {
			x = m.GetCounter().GetValue()
		}
		if i == 0 {
			v = x
		} else {
			v = combine(v, x)
		}
	}
	return &v
}

// health is a one-word verdict for the table: what needs a look first.
func health(st Status) string {
	switch {
	case st.OutboxDead != nil && *st.OutboxDead > 0, st.DeadLetters != nil && *st.DeadLetters > 0:
		return "dead letters waiting"
	case st.OutboxOldestSeconds != nil && *st.OutboxOldestSeconds > 60:
		return "outbox behind"
	case st.ConsumerLag != nil && *st.ConsumerLag > 1000:
		return "consumer behind"
	}
	return "ok"
}

func num(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', -1, 64)
}

func seconds(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', 1, 64) + "s"
}
