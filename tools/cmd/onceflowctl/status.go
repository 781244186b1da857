package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

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
	// KafkaConnected is the lowest of outbox_kafka_connected and
	// inbox_kafka_connected: 0 when any relay or consumer of the service
	// is waiting out a Kafka outage.
	KafkaConnected *float64 `json:"kafkaConnected,omitempty"`
	// DatabaseConnected is the lowest inbox_database_connected.
	DatabaseConnected *float64 `json:"databaseConnected,omitempty"`
	// DuplicateSettlements is reconciler_duplicate_settlements_total: the
	// payments the third party booked twice (the stand-in only).
	DuplicateSettlements *float64 `json:"duplicateSettlements,omitempty"`
	// Verdict is ok, degraded or failing; Reasons say why it is not ok.
	Verdict string   `json:"verdict"`
	Reasons []string `json:"reasons,omitempty"`
}

// The verdicts, worst last. failing: something is broken now (a service
// unreachable or cut off from Kafka or its database, a payment booked
// twice). degraded: work is waiting for a person or falling behind (dead
// letters, an old backlog, consumer lag).
const (
	verdictOK       = "ok"
	verdictDegraded = "degraded"
	verdictFailing  = "failing"
)

// StatusReport is status's JSON: the platform's verdict, the worst of its
// services', and each service's.
type StatusReport struct {
	Verdict  string   `json:"verdict"`
	Services []Status `json:"services"`
}

func worse(a, b string) string {
	rank := map[string]int{verdictOK: 0, verdictDegraded: 1, verdictFailing: 2}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

func (a *app) status(ctx context.Context, args []string) error {
	fs := newFlags("status", a.out)
	if err := fs.Parse(args); err != nil {
		return err
	}
	targets := a.services
	if a.reconcilerAdmin != "" {
		targets = append(targets[:len(targets):len(targets)], service{name: "reconciler", admin: a.reconcilerAdmin})
	}
	rep := StatusReport{Verdict: verdictOK}
	failed := 0
	for _, s := range targets {
		st, err := a.scrape(ctx, s)
		if err != nil {
			st = Status{Service: s.name, Error: err.Error()}
			failed++
		}
		judge(&st)
		rep.Verdict = worse(rep.Verdict, st.Verdict)
		rep.Services = append(rep.Services, st)
	}
	if a.json {
		if err := a.writeJSON(rep); err != nil {
			return err
		}
	} else {
		rows := make([][]string, 0, len(rep.Services))
		for _, st := range rep.Services {
			if st.Error != "" {
				rows = append(rows, []string{st.Service, "-", "-", "-", "-", "-", "-", "-", "unreachable: " + st.Error})
				continue
			}
			verdict := st.Verdict
			if len(st.Reasons) > 0 {
				verdict += ": " + strings.Join(st.Reasons, "; ")
			}
			rows = append(rows, []string{st.Service, num(st.OutboxPending), seconds(st.OutboxOldestSeconds),
				num(st.OutboxDead), num(st.ConsumerLag), num(st.DeadLetters), connected(st.KafkaConnected), num(st.DuplicateSettlements), verdict})
		}
		if err := a.table([]string{"SERVICE", "OUTBOX PENDING", "OLDEST PENDING", "OUTBOX DEAD", "CONSUMER LAG", "DEAD LETTERS", "KAFKA", "BOOKED TWICE", "STATUS"}, rows); err != nil {
			return err
		}
		fmt.Fprintf(a.out, "\nverdict: %s\n", rep.Verdict)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d services could not be read", failed, len(rep.Services))
	}
	if rep.Verdict == verdictFailing {
		return errors.New("the platform is failing (see STATUS)")
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
		KafkaConnected: lowest(aggregate(families["outbox_kafka_connected"], math.Min),
			aggregate(families["inbox_kafka_connected"], math.Min)),
		DatabaseConnected:    aggregate(families["inbox_database_connected"], math.Min),
		DuplicateSettlements: aggregate(families["reconciler_duplicate_settlements_total"], math.Max),
	}, nil
}

// lowest is the smaller of the values present, nil when neither is.
func lowest(a, b *float64) *float64 {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case *b < *a:
		return b
	}
	return a
}

func aggregate(mf *dto.MetricFamily, combine func(float64, float64) float64) *float64 {
	if mf == nil || len(mf.GetMetric()) == 0 {
		return nil
	}
	var v float64
	for i, m := range mf.GetMetric() {
		var x float64
		switch {
		case m.GetGauge() != nil:
			x = m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			x = m.GetCounter().GetValue()
		default: // an exporter that declares no TYPE
			x = m.GetUntyped().GetValue()
		}
		if i == 0 {
			v = x
		} else {
			v = combine(v, x)
		}
	}
	return &v
}

// judge sets st's verdict and the reasons for it, the worst first.
func judge(st *Status) {
	st.Verdict = verdictOK
	add := func(verdict, reason string) {
		st.Verdict = worse(st.Verdict, verdict)
		st.Reasons = append(st.Reasons, reason)
	}
	positive := func(v *float64) bool { return v != nil && *v > 0 }
	if st.Error != "" {
		add(verdictFailing, "unreachable")
		return
	}
	if positive(st.DuplicateSettlements) {
		add(verdictFailing, fmt.Sprintf("%s payment(s) booked twice (docs/reconciliation.md#duplicate_settlements)", num(st.DuplicateSettlements)))
	}
	if st.KafkaConnected != nil && *st.KafkaConnected == 0 {
		add(verdictFailing, "Kafka unreachable")
	}
	if st.DatabaseConnected != nil && *st.DatabaseConnected == 0 {
		add(verdictFailing, "database unreachable")
	}
	if positive(st.OutboxDead) || positive(st.DeadLetters) {
		add(verdictDegraded, "dead letters waiting")
	}
	if st.OutboxOldestSeconds != nil && *st.OutboxOldestSeconds > 60 {
		add(verdictDegraded, "outbox behind")
	}
	if st.ConsumerLag != nil && *st.ConsumerLag > 1000 {
		add(verdictDegraded, "consumer behind")
	}
}

func connected(v *float64) string {
	switch {
	case v == nil:
		return "-"
	case *v == 0:
		return "down"
	}
	return "up"
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
