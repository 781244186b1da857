package dashboards_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
	"github.com/onceflow/onceflow/pkg/platform/testinfra"
)

// The platform as the tests run it: the four real programs, built from this
// repository and started as processes on free ports, each with a database
// and topics of its own, and a real Prometheus scraping them with the
// committed alert rules.

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// buildPrograms builds the four programs into a temporary directory.
func buildPrograms(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	cmd := exec.Command("go", "build", "-o", bin+string(filepath.Separator),
		"./services/orders/cmd/orders", "./services/billing/cmd/billing",
		"./services/reconciler-shim/cmd/shim", "./services/reconciler-shim/cmd/reconciler", "./tools/cmd/reconcile")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the programs: %v\n%s", err, out)
	}
	return bin
}

// process is a program the test started; it is stopped (SIGTERM) when the
// test ends, and its log is shown if the test failed.
type process struct {
	name, log string
	cmd       *exec.Cmd
	done      chan error
}

func startProcess(t *testing.T, name, path string, args []string, env map[string]string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &process{name: name, log: logPath, cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait(); logFile.Close() }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			body, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimSpace(string(body)), "\n")
			t.Logf("--- last lines of %s's log ---\n%s", name, strings.Join(lines[max(0, len(lines)-15):], "\n"))
		}
	})
	return p
}

func (p *process) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Errorf("%s did not stop within 20s of SIGTERM", p.name)
	}
}

// alive fails the test if the process has exited.
func (p *process) alive() error {
	select {
	case err := <-p.done:
		p.done <- err
		body, _ := os.ReadFile(p.log)
		return fmt.Errorf("%s exited (%v):\n%s", p.name, err, body)
	default:
		return nil
	}
}

func waitHTTP(t *testing.T, p *process, url string) {
	t.Helper()
	testinfra.WaitFor(t, 60*time.Second, p.name+" at "+url, func() (bool, error) {
		if err := p.alive(); err != nil {
			return false, err
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
	procs       map[string]*process
	brokers     []string
	ordersTopic string
}

// services in the order they start: each one's downstream first.
var services = []string{"reconciler", "reconciler-shim", "billing", "orders"}

func startPlatform(t *testing.T) *platform {
	t.Helper()
	brokers := strings.Join(testinfra.KafkaBrokers(t), ",")
	b := testinfra.KafkaBrokers(t)
	ordersTopic := testinfra.NewTopic(t, b, 3)
	testinfra.NewTopicNamed(t, b, ordersTopic+".dlt", 1)
	billingTopic := testinfra.NewTopic(t, b, 3)
	testinfra.NewTopicNamed(t, b, billingTopic+".dlt", 1)
	bin := buildPrograms(t)
	p := &platform{addrs: map[string]string{}, adminAddrs: map[string]string{}, procs: map[string]*process{}, brokers: b, ordersTopic: ordersTopic}
	for _, s := range services {
		p.addrs[s], p.adminAddrs[s] = freeAddr(t), freeAddr(t)
	}
	envs := map[string]map[string]string{
		"reconciler": {"LEDGER_PATH": filepath.Join(t.TempDir(), "ledger.jsonl")},
		"reconciler-shim": {"DATABASE_URL": testinfra.NewDatabase(t), "KAFKA_BROKERS": brokers,
			"BILLING_TOPIC": billingTopic, "CONSUMER_GROUP": testinfra.Name("shim"),
			"RECONCILER_URL": "http://" + p.addrs["reconciler"]},
		"billing": {"DATABASE_URL": testinfra.NewDatabase(t), "KAFKA_BROKERS": brokers,
			"ORDERS_TOPIC": ordersTopic, "BILLING_TOPIC": billingTopic, "CONSUMER_GROUP": testinfra.Name("billing")},
		"orders": {"DATABASE_URL": testinfra.NewDatabase(t), "KAFKA_BROKERS": brokers, "ORDERS_TOPIC": ordersTopic},
	}
	programs := map[string]string{"reconciler": "reconciler", "reconciler-shim": "shim", "billing": "billing", "orders": "orders"}
	for _, s := range services {
		env := envs[s]
		env["HTTP_ADDR"], env["ADMIN_ADDR"], env["LOG_LEVEL"] = p.addrs[s], p.adminAddrs[s], "warn"
		p.procs[s] = startProcess(t, s, filepath.Join(bin, programs[s]), nil, env)
		waitHTTP(t, p.procs[s], "http://"+p.addrs[s]+"/readyz")
	}
	// The reconcile job over the three databases and the ledger, serving
	// the reconcile_* gauges as Prometheus target "reconcile" (its one
	// listener is an operator one).
	p.adminAddrs["reconcile"] = freeAddr(t)
	p.procs["reconcile"] = startProcess(t, "reconcile", filepath.Join(bin, "reconcile"),
		[]string{"-serve", p.adminAddrs["reconcile"], "-interval", "2s"}, map[string]string{
			"ONCEFLOW_RECONCILE_ORDERS_URL":  envs["orders"]["DATABASE_URL"],
			"ONCEFLOW_RECONCILE_BILLING_URL": envs["billing"]["DATABASE_URL"],
			"ONCEFLOW_RECONCILE_SHIM_URL":    envs["reconciler-shim"]["DATABASE_URL"],
			"ONCEFLOW_LEDGER_URL":            "http://" + p.addrs["reconciler"],
		})
	waitHTTP(t, p.procs["reconcile"], "http://"+p.adminAddrs["reconcile"]+"/metrics")
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
	addr := freeAddr(t)
	p := startProcess(t, "prometheus", bin, []string{
		"--config.file=" + cfgPath,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
		"--log.level=warn",
	}, nil)
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status    string          `json:"status"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("decoding %s: %w", path, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s", body.ErrorType, body.Error)
	}
	return json.Unmarshal(body.Data, data)
}
