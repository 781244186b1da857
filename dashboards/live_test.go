package dashboards_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/dashboards"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// TestEveryQueryReturnsDataFromTheRunningPlatform runs the real platform
// under a little load, lets a real Prometheus scrape it with the committed
// rules loaded, and evaluates every dashboard query and every alert
// expression through Prometheus's HTTP API. Each must parse, name only
// metrics that some program exports, and return data: an alert's comparison
// is stripped for that, so that its operands are checked, not whether it
// fires.
func TestEveryQueryReturnsDataFromTheRunningPlatform(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	p := startPlatform(t)
	prom := startPrometheus(t, p.adminAddrs)

	// A poison message: billing dead-letters it, so the dead-letter series move.
	if err := p.poison(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.placeOrders(ctx, 40, 5); err != nil {
		t.Fatal(err)
	}
	// 40 captures and 8 refunds reach the third party.
	testinfra.WaitFor(t, 90*time.Second, "48 settlements seen by Prometheus", func() (bool, error) {
		r, err := prom.query(ctx, `sum(shim_forwards_total)`)
		return err == nil && len(r.Result) == 1 && sampleValue(r.Result[0].Value) >= 48, nil
	})
	// Keep a trickle of orders going, so every rate has something to show.
	loadCtx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan error, 1)
	go func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < 400; i++ {
			select {
			case <-loadCtx.Done():
				loadDone <- nil
				return
			case <-tick.C:
			}
			if err := p.placeOrders(loadCtx, 1, 2); err != nil && loadCtx.Err() == nil {
				loadDone <- err
				return
			}
		}
		loadDone <- nil
	}()
	defer func() {
		stopLoad()
		if err := <-loadDone; err != nil {
			t.Errorf("background load: %v", err)
		}
	}()
	testinfra.WaitFor(t, 30*time.Second, "billing to dead-letter the poison message", func() (bool, error) {
		r, err := prom.query(ctx, `sum(inbox_dead_lettered_total{service="billing", reason="undecodable"})`)
		return err == nil && len(r.Result) == 1 && sampleValue(r.Result[0].Value) == 1, nil
	})
	// Wait until the trickle shows in a rate, and every target is up.
	testinfra.WaitFor(t, 60*time.Second, "every target up and the settlement lag histogram moving", func() (bool, error) {
		up, err := prom.query(ctx, `sum(up)`)
		if err != nil || len(up.Result) != 1 || sampleValue(up.Result[0].Value) != float64(len(p.adminAddrs)) {
			return false, nil
		}
		r, err := prom.query(ctx, `sum(rate(shim_settlement_lag_seconds_count[30s]))`)
		return err == nil && len(r.Result) == 1 && sampleValue(r.Result[0].Value) > 0, nil
	})

	var exported []string
	if err := prom.get(ctx, "/api/v1/label/__name__/values", &exported); err != nil {
		t.Fatal(err)
	}

	// The checks below bite: a misspelt metric is not exported, and returns nothing.
	const typo = "orders_place_total"
	if r, err := prom.query(ctx, "sum(rate("+typo+"[30s]))"); err != nil || len(r.Result) != 0 || slices.Contains(exported, typo) {
		t.Fatalf("a query for the unexported %s: %+v, %v; the checks would not catch a typo", typo, r, err)
	}

	// Every dashboard query, as committed.
	files := map[string][]byte{}
	paths, _ := filepath.Glob("grafana/dashboards/*.json")
	for _, path := range paths {
		body, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(path)] = body
	}
	queries, err := dashboards.Queries(files)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(queries))
	for k := range queries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	type check struct{ name, expr string }
	var checks []check
	for _, name := range keys {
		expr := grafanaToPromQL(queries[name])
		checkNames(t, name, expr, exported)
		checks = append(checks, check{name, expr})
	}

	// Every alert expression: the whole must parse, each operand must return data.
	rules := loadRules(t)
	for _, rule := range rules {
		name := "alert " + rule.Alert
		checkNames(t, name, rule.Expr, exported)
		if _, err := prom.query(ctx, rule.Expr); err != nil {
			t.Errorf("%s: Prometheus refused %s: %v", name, rule.Expr, err)
			continue
		}
		for _, operand := range operands(rule.Expr) {
			checks = append(checks, check{name + " (operand)", operand})
		}
	}

	// Each query must return data. A busy machine may delay a scrape past its
	// timeout and leave a gap in a series, so a query without data is asked
	// again, until a deadline, before it counts as failed.
	deadline := time.Now().Add(60 * time.Second)
	for len(checks) > 0 {
		var empty []check
		for _, c := range checks {
			r, err := prom.query(ctx, c.expr)
			switch {
			case err != nil:
				t.Errorf("%s: Prometheus refused %s: %v", c.name, c.expr, err)
			case len(r.Result) == 0:
				empty = append(empty, c)
			}
		}
		if len(empty) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, c := range empty {
				t.Errorf("%s: no data for %s", c.name, c.expr)
				logSeries(t, ctx, prom, append(metricNames(c.expr), "up", "scrape_duration_seconds"))
			}
			break
		}
		t.Logf("%d queries without data yet (%s …); asking again", len(empty), empty[0].name)
		checks = empty
		<-time.After(2 * time.Second)
	}

	// And Prometheus itself loaded and evaluates every rule without error.
	var loaded struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	testinfra.WaitFor(t, 20*time.Second, "every rule evaluated by Prometheus", func() (bool, error) {
		if err := prom.get(ctx, "/api/v1/rules", &loaded); err != nil {
			return false, err
		}
		n := 0
		for _, g := range loaded.Groups {
			for _, r := range g.Rules {
				if r.Health != "ok" {
					return false, nil
				}
				n++
			}
		}
		return n == len(rules), nil
	})
	t.Logf("%d dashboard queries and %d alert rules returned data; %d metric names exported", len(queries), len(rules), len(exported))
	if len(queries) == 0 || len(rules) == 0 {
		t.Fatal("nothing was checked")
	}
}

// logSeries logs the last 30 s of samples of each metric, to explain a query
// without data.
func logSeries(t *testing.T, ctx context.Context, prom *promServer, metrics []string) {
	t.Helper()
	for _, m := range metrics {
		var raw struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		}
		err := prom.get(ctx, "/api/v1/query?query="+url.QueryEscape(m+"[30s]"), &raw)
		t.Logf("%s[30s] (%v):", m, err)
		for _, r := range raw.Result {
			t.Logf("  %s %s: %v", r.Metric["service"], r.Metric["__name__"], r.Values)
		}
	}
}

// grafanaToPromQL replaces the Grafana variables the dashboards use with
// what Grafana would send (every service, a rate window of 30 scrapes),
// and turns a label_values() variable query into the PromQL it runs.
func grafanaToPromQL(expr string) string {
	if m := labelValues.FindStringSubmatch(expr); m != nil {
		return "count by (" + m[2] + ") (" + m[1] + ")"
	}
	return strings.NewReplacer(`$service`, `.*`, `$__rate_interval`, `1m`).Replace(expr)
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// checkNames fails the test for every metric expr names that no scraped
// program exports.
func checkNames(t *testing.T, name, expr string, exported []string) {
	t.Helper()
	for _, m := range metricNames(expr) {
		if !slices.Contains(exported, m) {
			t.Errorf("%s: metric %s is exported by no program (%s)", name, m, expr)
		}
	}
}

var (
	promqlStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlMatchers  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promqlGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent     = regexp.MustCompile(`\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(\s*\()?`)
	promqlKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true, "by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	promqlOperators = []string{">=", "<=", "==", "!=", ">", "<", " and ", " or ", " unless "}
)

// metricNames returns the metric names in expr: the identifiers that are not
// functions, keywords, label names or label values.
func metricNames(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, m := range promqlIdent.FindAllStringSubmatch(s, -1) {
		id := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m[0]), "("))
		if m[1] != "" || promqlKeywords[strings.ToLower(id)] || slices.Contains(names, id) {
			continue
		}
		names = append(names, id)
	}
	return names
}

// operands splits expr at its top-level comparison and set operators (the
// boolean part of an alert) and returns the operands that are not numbers,
// without their binary-operator modifiers.
func operands(expr string) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(expr); i++ {
		switch expr[i] {
		case '(', '{', '[':
			depth++
			continue
		case ')', '}', ']':
			depth--
			continue
		case '"':
			for i++; i < len(expr) && expr[i] != '"'; i++ {
				if expr[i] == '\\' {
					i++
				}
			}
			continue
		}
		if depth != 0 {
			continue
		}
		for _, op := range promqlOperators {
			if strings.HasPrefix(expr[i:], op) {
				parts = append(parts, expr[start:i])
				i += len(op) - 1
				start = i + 1
				break
			}
		}
	}
	parts = append(parts, expr[start:])
	var out []string
	for _, p := range parts {
		p = strings.TrimSpace(promqlModifier.ReplaceAllString(p, ""))
		if _, err := strconv.ParseFloat(p, 64); err == nil || p == "" {
			continue
		}
		out = append(out, p)
	}
	return out
}

var promqlModifier = regexp.MustCompile(`^\s*(bool\s+)?((on|ignoring)\s*\([^)]*\)\s*)?((group_left|group_right)\s*(\([^)]*\))?\s*)?`)

func sampleValue(v [2]any) float64 {
	s, _ := v[1].(string)
	f, _ := strconv.ParseFloat(s, 64)
	return f
}

func TestPromQLHelpers(t *testing.T) {
	for _, c := range []struct {
		expr     string
		names    []string
		operands []string
	}{
		{`max by (service) (outbox_oldest_pending_age_seconds) > 60`,
			[]string{"outbox_oldest_pending_age_seconds"}, []string{"max by (service) (outbox_oldest_pending_age_seconds)"}},
		{`max by (service) (outbox_pending_events) > 0 and sum by (service) (rate(outbox_published_total[5m])) == 0`,
			[]string{"outbox_pending_events", "outbox_published_total"},
			[]string{"max by (service) (outbox_pending_events)", "sum by (service) (rate(outbox_published_total[5m]))"}},
		{`up{service!=""} == 0`, []string{"up"}, []string{`up{service!=""}`}},
		{`a{x=~"b|c", y!="z>1"} / on (x) group_left c_total >= bool 1e-9`,
			[]string{"a", "c_total"}, []string{`a{x=~"b|c", y!="z>1"} / on (x) group_left c_total`}},
		{`histogram_quantile(0.99, sum by (le) (rate(x_bucket{service=~".*"}[15s])))`,
			[]string{"x_bucket"}, []string{`histogram_quantile(0.99, sum by (le) (rate(x_bucket{service=~".*"}[15s])))`}},
	} {
		if got := metricNames(c.expr); !slices.Equal(got, c.names) {
			t.Errorf("metricNames(%s) = %q, want %q", c.expr, got, c.names)
		}
		if got := operands(c.expr); !slices.Equal(got, c.operands) {
			t.Errorf("operands(%s) = %q, want %q", c.expr, got, c.operands)
		}
	}
	if got := grafanaToPromQL(dashboards.VariableQuery); got != "count by (service) (up)" {
		t.Errorf("the service variable's query becomes %q", got)
	}
}
