package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

type options struct {
	orders        int
	cancelRatio   float64
	concurrency   int
	timeout       time.Duration
	ordersURL     string
	billingURL    string
	shimURL       string
	reconcilerURL string
	// The operator listeners (ADMIN_ADDR): /metrics, /admin/... with the token.
	ordersAdminURL  string
	billingAdminURL string
	shimAdminURL    string
	adminTokenFile  string
	// journeyFile receives one order's id for `make demo` to follow with
	// onceflowctl journey: a cancelled one when there is one, since its
	// journey shows both events.
	journeyFile string
}

func parseFlags(args []string, out io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.IntVar(&o.orders, "orders", 300, "orders to place")
	fs.Float64Var(&o.cancelRatio, "cancel", 0.1, "fraction of orders to cancel right after placing them")
	fs.IntVar(&o.concurrency, "concurrency", 8, "concurrent HTTP clients")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "how long to wait for every payment to settle")
	fs.StringVar(&o.ordersURL, "orders-url", "http://127.0.0.1:8081", "orders service")
	fs.StringVar(&o.billingURL, "billing-url", "http://127.0.0.1:8082", "billing service")
	fs.StringVar(&o.shimURL, "shim-url", "http://127.0.0.1:8083", "reconciler shim")
	fs.StringVar(&o.reconcilerURL, "reconciler-url", "http://127.0.0.1:8084", "third-party reconciler stand-in")
	fs.StringVar(&o.ordersAdminURL, "orders-admin-url", "http://127.0.0.1:9081", "orders' operator listener (ADMIN_ADDR)")
	fs.StringVar(&o.billingAdminURL, "billing-admin-url", "http://127.0.0.1:9082", "billing's operator listener (/metrics)")
	fs.StringVar(&o.shimAdminURL, "shim-admin-url", "http://127.0.0.1:9083", "the shim's operator listener (/metrics)")
	fs.StringVar(&o.adminTokenFile, "admin-token-file", ".devstack/admin-token",
		"file holding the operator token (devstack/services.sh writes it); empty or missing skips the authenticated check")
	fs.StringVar(&o.journeyFile, "journey-file", "", "write one settled order's id (a cancelled one if any) to this file, for onceflowctl journey")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.orders < 1 || o.concurrency < 1 || o.cancelRatio < 0 || o.cancelRatio > 1 {
		return o, errors.New("want -orders >= 1, -concurrency >= 1 and 0 <= -cancel <= 1")
	}
	return o, nil
}

// placed is what the demo remembers of each order it placed.
type placed struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"createdAt"`
	cancelled bool
}

type settlement struct {
	OrderID    string    `json:"orderId"`
	Kind       string    `json:"kind"`
	ReceivedAt time.Time `json:"receivedAt"`
}

// run is main without the process (lifecycle.RunFunc). The demo is
// configured by flags only, so getenv goes unused.
func run(ctx context.Context, args []string, _ func(string) string, out io.Writer) error {
	o, err := parseFlags(args[1:], out)
	if err != nil {
		return err
	}
	c := &client{http: &http.Client{Timeout: 10 * time.Second}}
	for name, url := range map[string]string{"orders": o.ordersURL, "billing": o.billingURL, "shim": o.shimURL, "reconciler": o.reconcilerURL} {
		if err := c.get(ctx, url+"/readyz", nil); err != nil {
			return fmt.Errorf("%s is not ready at %s (start the platform with `make demo` or `make services`): %w", name, url, err)
		}
	}
	// A consumer that just started joins its group before it reads; one order
	// through the whole pipeline first keeps that one-time wait out of the lags.
	fmt.Fprintln(out, "warming up: one order through the whole pipeline …")
	warm := time.Now()
	warmup, err := placeOne(ctx, c, options{ordersURL: o.ordersURL}, -1)
	if err != nil {
		return err
	}
	if _, err := waitSettled(ctx, c, o, []placed{warmup}, 1, io.Discard); err != nil {
		return fmt.Errorf("warming up: %w", err)
	}
	fmt.Fprintf(out, "pipeline is flowing (first order settled after %v)\n", time.Since(warm).Round(time.Millisecond))
	dupsBefore := c.duplicates(ctx, o.billingAdminURL, o.shimAdminURL)

	fmt.Fprintf(out, "placing %d orders (cancelling about %.0f%%) with %d clients …\n", o.orders, o.cancelRatio*100, o.concurrency)
	start := time.Now()
	orders, err := placeOrders(ctx, c, o, out)
	if err != nil {
		return err
	}
	cancelled := 0
	for _, p := range orders {
		if p.cancelled {
			cancelled++
		}
	}
	fmt.Fprintf(out, "placed %d orders and cancelled %d in %v\n", len(orders), cancelled, time.Since(start).Round(time.Millisecond))

	want := len(orders) + cancelled
	fmt.Fprintf(out, "waiting for %d settlements at the third party (%d captures, %d refunds) …\n", want, len(orders), cancelled)
	byOrder, err := waitSettled(ctx, c, o, orders, want, out)
	if err != nil {
		return err
	}
	if err := summarize(ctx, c, o, orders, byOrder, dupsBefore, out); err != nil {
		return err
	}
	return writeJourneyOrder(o.journeyFile, orders)
}

// writeJourneyOrder writes the id of the last cancelled order, or else the
// last order, to path ("" writes nothing).
func writeJourneyOrder(path string, orders []placed) error {
	if path == "" || len(orders) == 0 {
		return nil
	}
	pick := orders[len(orders)-1]
	for _, p := range orders {
		if p.cancelled {
			pick = p
		}
	}
	if err := os.WriteFile(path, []byte(pick.ID+"\n"), 0o644); err != nil {
		return fmt.Errorf("writing the journey's order id: %w", err)
	}
	return nil
}

func placeOrders(ctx context.Context, c *client, o options, out io.Writer) ([]placed, error) {
	var (
		mu       sync.Mutex
		orders   []placed
		firstErr error
		wg       sync.WaitGroup
	)
	jobs := make(chan int)
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				p, err := placeOne(ctx, c, o, i)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					orders = append(orders, p)
					if n := len(orders); n%100 == 0 {
						fmt.Fprintf(out, "  … %d/%d placed\n", n, o.orders)
					}
				}
				mu.Unlock()
			}
		}()
	}
	for i := range o.orders {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed || ctx.Err() != nil {
			break
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return orders, ctx.Err()
}

var currencies = []string{"EUR", "USD", "GBP", "CHF", "JPY"}

func placeOne(ctx context.Context, c *client, o options, i int) (placed, error) {
	body := map[string]any{
		"customerId":  fmt.Sprintf("demo-customer-%d", (i+50)%50),
		"amountCents": 100 + rand.IntN(100_000),
		"currency":    currencies[(i+len(currencies))%len(currencies)],
	}
	var p placed
	key := fmt.Sprintf("demo-%d-%d", time.Now().UnixNano(), i)
	if err := c.post(ctx, o.ordersURL+"/orders", key, body, &p); err != nil {
		return p, fmt.Errorf("placing order %d: %w", i, err)
	}
	if rand.Float64() < o.cancelRatio {
		if err := c.post(ctx, o.ordersURL+"/orders/"+p.ID+"/cancel", "", nil, nil); err != nil {
			return p, fmt.Errorf("cancelling order %s: %w", p.ID, err)
		}
		p.cancelled = true
	}
	return p, nil
}

// waitSettled polls the third party's ledger until it holds want settlements
// for this run's orders, printing progress once a second.
func waitSettled(ctx context.Context, c *client, o options, orders []placed, want int, out io.Writer) (map[string][]settlement, error) {
	ours := make(map[string]bool, len(orders))
	for _, p := range orders {
		ours[p.ID] = true
	}
	deadline := time.Now().Add(o.timeout)
	start := time.Now()
	for {
		var all []settlement
		if err := c.get(ctx, o.reconcilerURL+"/settlements", &all); err != nil {
			return nil, err
		}
		byOrder := make(map[string][]settlement)
		got := 0
		for _, s := range all {
			if ours[s.OrderID] {
				byOrder[s.OrderID] = append(byOrder[s.OrderID], s)
				got++
			}
		}
		fmt.Fprintf(out, "  … %d/%d settled after %v\n", got, want, time.Since(start).Round(100*time.Millisecond))
		if got >= want {
			return byOrder, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d settlements arrived within %v; see .devstack/logs/ and `make status`", got, want, o.timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func summarize(ctx context.Context, c *client, o options, orders []placed, byOrder map[string][]settlement, dupsBefore map[string]float64, out io.Writer) error {
	var (
		lags                          []time.Duration
		exactlyOnce, charges, refunds int
		problems                      []string
		cancelled                     int
	)
	for _, p := range orders {
		var captures, refundsSeen int
		for _, s := range byOrder[p.ID] {
			switch s.Kind {
			case "capture":
				captures++
				lags = append(lags, s.ReceivedAt.Sub(p.CreatedAt))
			case "refund":
				refundsSeen++
			}
		}
		wantRefunds := 0
		if p.cancelled {
			wantRefunds = 1
			cancelled++
		}
		if captures == 1 && refundsSeen == wantRefunds {
			exactlyOnce++
		} else if len(problems) < 10 {
			problems = append(problems, fmt.Sprintf("order %s: %d captures and %d refunds, want 1 and %d", p.ID, captures, refundsSeen, wantRefunds))
		}
		var ch struct {
			Status string `json:"status"`
		}
		if err := c.get(ctx, o.billingURL+"/charges/"+p.ID, &ch); err == nil {
			charges++
			if ch.Status == "refunded" {
				refunds++
			}
		}
	}
	dupsAfter := c.duplicates(ctx, o.billingAdminURL, o.shimAdminURL)
	slices.Sort(lags)
	settlements := 0
	for _, ss := range byOrder {
		settlements += len(ss)
	}

	fmt.Fprintln(out)
	fmt.Fprintln(out, "onceflow demo: summary")
	fmt.Fprintf(out, "  orders placed                     %6d  (%d cancelled)\n", len(orders), cancelled)
	fmt.Fprintf(out, "  charges recorded by billing       %6d  (%d refunded)\n", charges, refunds)
	fmt.Fprintf(out, "  settlements at the third party    %6d\n", settlements)
	fmt.Fprintf(out, "  orders settled exactly once       %6d / %d\n", exactlyOnce, len(orders))
	fmt.Fprintf(out, "  duplicates absorbed by inboxes    %6.0f  (billing %.0f, shim %.0f)\n",
		dupsAfter["billing"]-dupsBefore["billing"]+dupsAfter["shim"]-dupsBefore["shim"],
		dupsAfter["billing"]-dupsBefore["billing"], dupsAfter["shim"]-dupsBefore["shim"])
	if len(lags) > 0 {
		fmt.Fprintf(out, "  commit → settlement lag           p50 %v   p99 %v   max %v\n",
			percentile(lags, 0.50), percentile(lags, 0.99), lags[len(lags)-1].Round(time.Millisecond))
	}
	problems = append(problems, c.operatorSurface(ctx, out, o)...)
	if len(problems) > 0 || charges != len(orders) || refunds != cancelled {
		fmt.Fprintln(out, "\nFAILED:")
		for _, p := range problems {
			fmt.Fprintln(out, "  "+p)
		}
		return fmt.Errorf("%d of %d orders were not settled exactly once (charges %d, refunds %d)",
			len(orders)-exactlyOnce, len(orders), charges, refunds)
	}
	fmt.Fprintln(out, "\nevery order was charged once and reached the third party exactly once.")
	return nil
}

// operatorSurface shows that the operator endpoints are off the public port
// and need the token on the operator port, and returns what is not so.
func (c *client) operatorSurface(ctx context.Context, out io.Writer, o options) []string {
	token := ""
	if o.adminTokenFile != "" {
		if b, err := os.ReadFile(o.adminTokenFile); err == nil {
			token = strings.TrimSpace(string(b))
		}
	}
	checks := []struct {
		what, url, token string
		want             int
	}{
		{"public port", o.ordersURL + "/admin/outbox/dead", "", http.StatusNotFound},
		{"operator port, no token", o.ordersAdminURL + "/admin/outbox/dead", "", http.StatusUnauthorized},
		{"operator port, token", o.ordersAdminURL + "/admin/outbox/dead", token, http.StatusOK},
	}
	fmt.Fprintln(out, "\noperator surface (orders' dead outbox events):")
	var problems []string
	for _, ch := range checks {
		if ch.want == http.StatusOK && token == "" {
			fmt.Fprintf(out, "  %-24s GET %-45s skipped: no token in %q\n", ch.what, ch.url, o.adminTokenFile)
			continue
		}
		status := 0
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ch.url, nil)
		if err == nil {
			if ch.token != "" {
				req.Header.Set("Authorization", "Bearer "+ch.token)
			}
			var resp *http.Response
			if resp, err = c.http.Do(req); err == nil {
				status = resp.StatusCode
				resp.Body.Close()
			}
		}
		fmt.Fprintf(out, "  %-24s GET %-45s → %d\n", ch.what, ch.url, status)
		if status != ch.want {
			problems = append(problems, fmt.Sprintf("%s: GET %s = %d (%v), want %d", ch.what, ch.url, status, err, ch.want))
		}
	}
	return problems
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(float64(len(sorted)-1) * q)
	return sorted[i].Round(time.Millisecond)
}

// client is a tiny JSON-over-HTTP client.
type client struct{ http *http.Client }

func (c *client) get(ctx context.Context, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	return c.do(req, out)
}

func (c *client) post(ctx context.Context, url, idempotencyKey string, in, out any) error {
	var body io.Reader = http.NoBody
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", idempotencyKey)
	}
	return c.do(req, out)
}

func (c *client) do(req *http.Request, out any) error {
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", req.Method, req.URL.Path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// duplicates reads inbox_duplicates_total from billing's and the shim's
// /metrics (0 when unreachable: it is a report, not a check).
func (c *client) duplicates(ctx context.Context, billingURL, shimURL string) map[string]float64 {
	res := map[string]float64{}
	for name, url := range map[string]string{"billing": billingURL, "shim": shimURL} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
		if err != nil {
			continue
		}
		resp, err := c.http.Do(req)
		if err != nil {
			continue
		}
		res[name] = sumMetric(resp.Body, "inbox_duplicates_total")
		resp.Body.Close()
	}
	return res
}

// sumMetric adds up every sample of name in Prometheus text format.
func sumMetric(r io.Reader, name string) float64 {
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest != "" && rest[0] != '{' && rest[0] != ' ' {
			continue // another metric with this prefix
		}
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}
