package dashboards_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/dashboards"
)

// The committed JSON is what the code generates: after changing a dashboard,
// run `go generate ./dashboards/`.
func TestCommittedDashboardsAreCurrent(t *testing.T) {
	want, err := dashboards.Files()
	if err != nil {
		t.Fatal(err)
	}
	onDisk, err := filepath.Glob("grafana/dashboards/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk) != len(want) {
		t.Errorf("grafana/dashboards has %d files, the code generates %d: run `go generate ./dashboards/` (and delete stale files)", len(onDisk), len(want))
	}
	for name, body := range want {
		got, err := os.ReadFile(filepath.Join("grafana/dashboards", name))
		if err != nil || !bytes.Equal(got, body) {
			t.Errorf("grafana/dashboards/%s is not what the code generates: run `go generate ./dashboards/`", name)
		}
	}
}

// Every query filters on the service variable, so the variable means
// something on every panel, and every panel says what healthy looks like.
func TestEveryPanelIsFilteredAndDescribed(t *testing.T) {
	files, err := dashboards.Files()
	if err != nil {
		t.Fatal(err)
	}
	queries, err := dashboards.Queries(files)
	if err != nil {
		t.Fatal(err)
	}
	if len(queries) < 40 {
		t.Fatalf("only %d queries found in the dashboards", len(queries))
	}
	for name, expr := range queries {
		if strings.Contains(name, ": variable ") {
			continue
		}
		if !strings.Contains(expr, `service=~"$service"`) {
			t.Errorf("%s does not filter on the service variable: %s", name, expr)
		}
	}
	for name, body := range files {
		for _, want := range []string{`"unit"`, `"description"`, "Healthy"} {
			if bytes.Count(body, []byte(want)) < bytes.Count(body, []byte(`"type": "timeseries"`))+bytes.Count(body, []byte(`"type": "stat"`)) {
				t.Errorf("%s: some panel lacks %s", name, want)
			}
		}
	}
}
