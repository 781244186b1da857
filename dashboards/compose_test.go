package dashboards_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// docker-compose.yml cannot run here (no Docker), so this keeps it consistent
// with the files it provisions: Prometheus and Grafana mount dashboards/ where
// their configurations expect it, and Prometheus scrapes every program on the
// port Compose gives it, labelled with its service.
func TestDockerComposeProvisionsPrometheusAndGrafana(t *testing.T) {
	var compose struct {
		Services map[string]struct {
			Command     any               `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
		} `yaml:"services"`
	}
	readYAML(t, "../docker-compose.yml", &compose)
	const mount = "./dashboards:/etc/onceflow/dashboards:ro"
	prom, ok := compose.Services["prometheus"]
	if !ok || !slices.Contains(prom.Volumes, mount) {
		t.Fatalf("docker-compose.yml: service prometheus must mount %s", mount)
	}
	cmd, _ := yaml.Marshal(prom.Command)
	if !strings.Contains(string(cmd), "--config.file=/etc/onceflow/dashboards/prometheus/prometheus.yml") {
		t.Errorf("prometheus must run with dashboards/prometheus/prometheus.yml, runs %s", cmd)
	}
	graf, ok := compose.Services["grafana"]
	if !ok || !slices.Contains(graf.Volumes, mount) ||
		!slices.Contains(graf.Volumes, "./dashboards/grafana/provisioning:/etc/grafana/provisioning:ro") {
		t.Fatalf("docker-compose.yml: service grafana must mount %s and the provisioning folder", mount)
	}
	home := graf.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
	if _, err := os.Stat(strings.Replace(home, "/etc/onceflow/dashboards/", "", 1)); err != nil {
		t.Errorf("grafana's home dashboard %s is not in dashboards/: %v", home, err)
	}

	var provider struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, "grafana/provisioning/dashboards/onceflow.yml", &provider)
	if len(provider.Providers) != 1 || provider.Providers[0].Options.Path != "/etc/onceflow/dashboards/grafana/dashboards" {
		t.Errorf("the dashboard provider must read /etc/onceflow/dashboards/grafana/dashboards, reads %+v", provider.Providers)
	}

	var promCfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string          `yaml:"targets"`
				Labels  map[string]string `yaml:"labels"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &promCfg)
	for _, rf := range promCfg.RuleFiles {
		if m, _ := filepath.Glob(filepath.Join("prometheus", rf)); len(m) == 0 {
			t.Errorf("prometheus.yml: rule_files %s matches no file", rf)
		}
	}
	scraped := map[string]string{}
	for _, sc := range promCfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				scraped[target] = st.Labels["service"]
			}
		}
	}
	for _, s := range services {
		// /metrics is on the operator listener.
		addr := compose.Services[s].Environment["ADMIN_ADDR"]
		_, port, _ := strings.Cut(addr, ":")
		if scraped[s+":"+port] != s {
			t.Errorf("prometheus.yml must scrape %s:%s (ADMIN_ADDR %q in docker-compose.yml) with service=%q; scrapes %v", s, port, addr, s, scraped)
		}
	}
	// The reconcile job has no ADMIN_ADDR: its one listener is -serve's, and
	// without its scrape the reconciliation alerts have no data.
	job, ok := compose.Services["reconcile"]
	if !ok {
		t.Fatal("docker-compose.yml must run the reconcile job (service reconcile), whose gauges the reconciliation alerts read")
	}
	var args []string
	if b, err := yaml.Marshal(job.Command); err != nil || yaml.Unmarshal(b, &args) != nil {
		t.Fatalf("service reconcile: command %v must be a list", job.Command)
	}
	i := slices.Index(args, "-serve")
	if len(args) == 0 || args[0] != "/usr/local/bin/reconcile" || i < 0 || i+1 >= len(args) {
		t.Fatalf("service reconcile must run /usr/local/bin/reconcile -serve ADDR, runs %v", args)
	}
	_, port, _ := strings.Cut(args[i+1], ":")
	if scraped["reconcile:"+port] != "reconcile" {
		t.Errorf("prometheus.yml must scrape reconcile:%s (-serve %s in docker-compose.yml) with service=\"reconcile\"; scrapes %v", port, args[i+1], scraped)
	}
	for _, key := range []string{"ONCEFLOW_RECONCILE_ORDERS_URL", "ONCEFLOW_RECONCILE_BILLING_URL", "ONCEFLOW_RECONCILE_SHIM_URL"} {
		// The defaults point at 127.0.0.1, and only reconcile_ro is read-only.
		if v := job.Environment[key]; !strings.HasPrefix(v, "postgres://reconcile_ro:") || !strings.Contains(v, "@postgres:5432/") {
			t.Errorf("service reconcile: %s = %q, want reconcile_ro's URL on the postgres service", key, v)
		}
	}
	if v := job.Environment["ONCEFLOW_LEDGER_URL"]; v != "http://reconciler:8084" {
		t.Errorf("service reconcile: ONCEFLOW_LEDGER_URL = %q, want the reconciler service's http://reconciler:8084", v)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(body, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
