package dashboards_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/platform/harness"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// The platform as the tests run it: the four real programs, built from this
// repository and started as processes on port 0 (platform/harness),
// each with a database and topics of its own, and a real Prometheus
// scraping them with the committed alert rules.

// buildPrograms builds the four programs and the reconcile tool once per
// test process.
func buildPrograms(t *testing.T) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	reconcile := harness.Spec{Name: "reconcile", Package: "./tools/cmd/reconcile"}
	bins, err := harness.BuildTree(ctx, filepath.Join(os.TempDir(), "onceflow-dashboards-test"), append(harness.Programs, reconcile)...)
	if err != nil {
		t.Fatal(err)
	}
	return bins
}

// start runs a program until the test ends (then SIGTERM; a hang fails the
// test), and shows its log's tail if the test failed.
func start(t *testing.T, cfg harness.Config) *harness.Proc {
	t.Helper()
	cfg.LogPath = filepath.Join(t.TempDir(), cmp.Or(cfg.Name, cfg.Spec.Name)+".log")
	p, err := harness.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(20 * time.Second); errors.Is(err, harness.ErrHung) {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("--- last lines of %s's log ---\n%s", p.Name(), p.Tail(15))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitHTTP waits until url answers 200, failing if p exits first.
func waitHTTP(t *testing.T, p *harness.Proc, url string) {
	t.Helper()
	testinfra.WaitFor(t, 60*time.Second, p.Name()+" at "+url, func() (bool, error) {
		if !p.Running() {
			return false, fmt.Errorf("%s exited (%v):\n%s", p.Name(), p.ExitErr(), p.Tail(30))
		}
		resp, err := http.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// platform is the four programs, ready.
type platform struct {
	addrs       map[string]string // service label -> public address
	adminAddrs  map[string]string // service label -> operator address (/metrics)
	brokers     []string
	ordersTopic string
}

// services in the order they start: each one's downstream first; the
// label of each is its Compose service name.
var services = []string{"reconciler", "reconciler-shim", "billing", "orders"}

func startPlatform(t *testing.T) *platform {
	t.Helper()
	brokers := strings.Join(testinfra.KafkaBrokers(t), ",")
	b := testinfra.KafkaBrokers(t)
	ordersTopic := testinfra.NewTopic(t, b, 3)
	testinfra.NewTopicNamed(t, b, ordersTopic+".dlt", 1)
	billingTopic := testinfra.NewTopic(t, b, 3)
	testinfra.NewTopicNamed(t, b, billingTopic+".dlt", 1)
	// A leader named in the metadata may not serve its partition yet: a
	// consumer started then gets Not Leader For Partition (issue 11).
	readyCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkautil.WaitTopicsReady(readyCtx, b, ordersTopic, ordersTopic+".dlt", billingTopic, billingTopic+".dlt"); err != nil {
		t.Fatal(err)
	}
	bins := buildPrograms(t)
	p := &platform{addrs: map[string]string{}, adminAddrs: map[string]string{}, brokers: b, ordersTopic: ordersTopic}
	dbs := map[string]string{"orders": testinfra.NewDatabase(t), "billing": testinfra.NewDatabase(t), "shim": testinfra.NewDatabase(t)}
	envs := map[string]func() map[string]string{
		"reconciler": func() map[string]string {
			return map[string]string{"LEDGER_PATH": filepath.Join(t.TempDir(), "ledger.jsonl")}
		},
		"shim": func() map[string]string {
			return map[string]string{"DATABASE_URL": dbs["shim"], "KAFKA_BROKERS": brokers,
				"BILLING_TOPIC": billingTopic, "CONSUMER_GROUP": testinfra.Name("shim"),
				"RECONCILER_URL": "http://" + p.addrs["reconciler"]}
		},
		"billing": func() map[string]string {
			return map[string]string{"DATABASE_URL": dbs["billing"], "KAFKA_BROKERS": brokers,
				"ORDERS_TOPIC": ordersTopic, "BILLING_TOPIC": billingTopic, "CONSUMER_GROUP": testinfra.Name("billing")}
		},
		"orders": func() map[string]string {
			return map[string]string{"DATABASE_URL": dbs["orders"], "KAFKA_BROKERS": brokers, "ORDERS_TOPIC": ordersTopic}
		},
	}
	for _, spec := range harness.Programs {
		env := envs[spec.Name]()
		env["LOG_LEVEL"] = "warn"
		pr := start(t, harness.Config{Spec: spec, Bin: bins[spec.Name], Env: env})
		p.addrs[spec.Compose], p.adminAddrs[spec.Compose] = pr.HTTPAddr(), pr.AdminAddr()
		waitHTTP(t, pr, pr.URL()+"/readyz")
	}
	// The reconcile job over the three databases and the ledger, serving
	// the reconcile_* gauges as Prometheus target "reconcile" (its one
	// listener is an operator one). A tool's flag takes no port 0 it would
	// report: the port is picked in advance.
	addrs, err := harness.FreeAddrs(1)
	if err != nil {
		t.Fatal(err)
	}
	p.adminAddrs["reconcile"] = addrs[0]
	rec := start(t, harness.Config{Name: "reconcile", Bin: bins["reconcile"], NoAddrs: true,
		Args: []string{"-serve", p.adminAddrs["reconcile"], "-interval", "2s"}, Env: map[string]string{
			"ONCEFLOW_RECONCILE_ORDERS_URL":  dbs["orders"],
			"ONCEFLOW_RECONCILE_BILLING_URL": dbs["billing"],
			"ONCEFLOW_RECONCILE_SHIM_URL":    dbs["shim"],
			"ONCEFLOW_LEDGER_URL":            "http://" + p.addrs["reconciler"],
		}})
	waitHTTP(t, rec, "http://"+p.adminAddrs["reconcile"]+"/metrics")
	return p
}

// poison writes a message that is no event to the orders topic.
func (p *platform) poison(ctx context.Context) error {
	w := kafkautil.NewWriter(p.brokers, 1)
	defer w.Close()
	return w.WriteMessages(ctx, kafka.Message{Topic: p.ordersTopic, Key: []byte("poison"), Value: []byte("not an event")})
}

// placeOrders places n orders and cancels every cancelEvery-th one.
func (p *platform) placeOrders(ctx context.Context, n, cancelEvery int) error {
	base := "http://" + p.addrs["orders"]
	for i := range n {
		body := fmt.Sprintf(`{"customerId":"cust-%d","amountCents":%d,"currency":"EUR"}`, i%7, 100+i)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		var o struct{ ID string }
		err = json.NewDecoder(resp.Body).Decode(&o)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("placing an order: status %d, %v", resp.StatusCode, err)
		}
		if cancelEvery > 0 && i%cancelEvery == 0 {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders/"+o.ID+"/cancel", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("cancelling an order: status %d", resp.StatusCode)
			}
		}
	}
	return nil
}

// promServer is a Prometheus the test started.
type promServer struct {
	url string
}

// startPrometheus starts Debian's Prometheus on a free port, scraping
// targets (service label -> address) every 2 seconds and evaluating the
// committed rules every second.
func startPrometheus(t *testing.T, targets map[string]string) *promServer {
	t.Helper()
	bin := tool(t, "prometheus")
	rules, err := filepath.Abs("alerts")
	if err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 1s\n")
	fmt.Fprintf(&cfg, "rule_files:\n  - %q\n", filepath.Join(rules, "*.yml"))
	fmt.Fprintf(&cfg, "scrape_configs:\n  - job_name: onceflow\n    static_configs:\n")
	for service, addr := range targets {
		fmt.Fprintf(&cfg, "      - targets: [%q]\n        labels: {service: %q}\n", addr, service)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addrs, err := harness.FreeAddrs(1) // a flag: no port 0 it would report
	if err != nil {
		t.Fatal(err)
	}
	addr := addrs[0]
	p := start(t, harness.Config{Name: "prometheus", Bin: bin, NoAddrs: true, Args: []string{
		"--config.file=" + cfgPath,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
		"--log.level=warn",
	}})
	waitHTTP(t, p, "http://"+addr+"/-/ready")
	return &promServer{url: "http://" + addr}
}

// apiResult is the data of a Prometheus API answer.
type apiResult struct {
	ResultType string `json:"resultType"`
	Result     []struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	} `json:"result"`
}

// query evaluates expr now; an error means Prometheus refused it.
func (s *promServer) query(ctx context.Context, expr string) (apiResult, error) {
	var out apiResult
	err := s.get(ctx, "/api/v1/query?query="+url.QueryEscape(expr), &out)
	return out, err
}

func (s *promServer) get(ctx context.Context, path string, data any) error {
	var body struct {
		Status    string          `json:"status"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Data      json.RawMessage `json:"data"`
	}
	if err := harness.GetJSON(ctx, s.url+path, &body); err != nil {
		return err
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s", body.ErrorType, body.Error)
	}
	return json.Unmarshal(body.Data, data)
}
