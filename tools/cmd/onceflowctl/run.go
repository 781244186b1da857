package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/onceflow/onceflow/platform/lifecycle"
	"github.com/onceflow/onceflow/tools/reconcile"
)

// A service the tool knows: its operator address and what its admin API has.
type service struct {
	name string
	// admin is the operator listener's base URL, e.g. http://127.0.0.1:9081.
	admin string
	// outbox: it serves /admin/outbox/*.
	outbox bool
	// inboxTopic is the topic whose dead letters /admin/inbox/* manages
	// ("" when it has no inbox); -topic overrides it.
	inboxTopic string
}

// app is what every command shares.
type app struct {
	services []service
	// reconcilerAdmin is the third party's operator address, read by
	// status for its duplicate bookings ("" skips it).
	reconcilerAdmin string
	token           string
	json            bool
	out             io.Writer
	hc              *http.Client
	getenv          func(string) string
}

const usage = `usage: onceflowctl [-o text|json] [-orders URL] [-billing URL] [-shim URL] [-reconciler URL|none] <command> [flags]

commands:
  status                     a verdict (ok, degraded, failing) and each service's outbox backlog,
                             oldest pending age, dead rows, consumer lag, dead letters, Kafka
                             connection and the payments the third party booked twice (/metrics)
  dead-letters list          dead outbox rows and inbox dead letters
  dead-letters requeue       put dead rows or dead letters back (-service, and -ids, -event-ids or -all)
  parked                     inbox events parked behind a dead event of their aggregate
                             (released once that one is requeued and applied)
  parked release | skip      the way out when the dead event cannot be requeued: release lets the
                             parked events be applied without it, skip records the dead and parked
                             events skipped (-service, -consumer, -aggregate-type, -aggregate, -reason)
  replay                     republish a window of outbox events (dry run unless -apply)
  journey <order-id>         every step of one order across the databases, the topics and the
                             third party's ledger, with each hop's latency and what is odd
  reconcile                  the reconciliation report (reads the databases; see reconcile -h)

ADMIN_TOKEN is sent as the bearer token. Run onceflowctl <command> -h for a command's flags.
`

// run is main without the process (lifecycle.RunFunc); args starts with the
// program's name.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("onceflowctl", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() { fmt.Fprint(stdout, usage) }
	env := func(key, def string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return def
	}
	output := fs.String("o", "text", "output: text or json")
	orders := fs.String("orders", env("ONCEFLOW_ORDERS_ADMIN", "http://127.0.0.1:9081"), "orders' operator address")
	billing := fs.String("billing", env("ONCEFLOW_BILLING_ADMIN", "http://127.0.0.1:9082"), "billing's operator address")
	shim := fs.String("shim", env("ONCEFLOW_SHIM_ADMIN", "http://127.0.0.1:9083"), "the reconciler shim's operator address")
	reconciler := fs.String("reconciler", env("ONCEFLOW_RECONCILER_ADMIN", "http://127.0.0.1:9084"),
		"the third-party stand-in's operator address, for status's duplicate bookings (none: skip it)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *output != "text" && *output != "json" {
		return fmt.Errorf("-o must be text or json, got %q", *output)
	}
	a := &app{
		services: []service{
			{name: "orders", admin: baseURL(*orders), outbox: true},
			{name: "billing", admin: baseURL(*billing), outbox: true, inboxTopic: env("ORDERS_TOPIC", "orders.events")},
			{name: "reconciler-shim", admin: baseURL(*shim), inboxTopic: env("BILLING_TOPIC", "billing.events")},
		},
		token:  getenv("ADMIN_TOKEN"),
		json:   *output == "json",
		out:    stdout,
		hc:     &http.Client{Timeout: 30 * time.Second},
		getenv: getenv,
	}
	if *reconciler != "none" {
		a.reconcilerAdmin = baseURL(*reconciler)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return fmt.Errorf("%w: no command given", lifecycle.ErrUsage)
	}
	switch cmd, cmdArgs := rest[0], rest[1:]; cmd {
	case "status":
		return a.status(ctx, cmdArgs)
	case "dead-letters":
		if len(cmdArgs) == 0 {
			return errors.New("dead-letters needs list or requeue")
		}
		switch cmdArgs[0] {
		case "-h", "-help", "--help", "help":
			fmt.Fprint(stdout, "usage: onceflowctl dead-letters list [flags] | onceflowctl dead-letters requeue [flags]\n"+
				"run onceflowctl dead-letters list -h or onceflowctl dead-letters requeue -h for their flags\n")
			return flag.ErrHelp
		case "list":
			return a.deadLettersList(ctx, cmdArgs[1:])
		case "requeue":
			return a.deadLettersRequeue(ctx, cmdArgs[1:])
		}
		return fmt.Errorf("dead-letters: unknown subcommand %q (list or requeue)", cmdArgs[0])
	case "parked":
		if len(cmdArgs) > 0 && (cmdArgs[0] == "release" || cmdArgs[0] == "skip") {
			return a.parkedAct(ctx, cmdArgs[0], cmdArgs[1:])
		}
		return a.parked(ctx, cmdArgs)
	case "replay":
		return a.replay(ctx, cmdArgs)
	case "journey":
		return a.journey(ctx, cmdArgs)
	case "reconcile":
		if a.json {
			cmdArgs = append([]string{"-o", "json"}, cmdArgs...)
		}
		return reconcile.Command(ctx, "onceflowctl reconcile", cmdArgs, getenv, stdout)
	default:
		fs.Usage()
		return fmt.Errorf("%w: unknown command %q", lifecycle.ErrUsage, cmd)
	}
}

// baseURL accepts an address with or without its scheme (ADMIN_ADDR's form).
func baseURL(addr string) string {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return strings.TrimRight(addr, "/")
}

func (a *app) service(name string) (service, error) {
	var names []string
	for _, s := range a.services {
		if s.name == name || (name == "shim" && s.name == "reconciler-shim") {
			return s, nil
		}
		names = append(names, s.name)
	}
	return service{}, fmt.Errorf("-service must be one of %s, got %q", strings.Join(names, ", "), name)
}

// selected is the service -service names, or every service when it is "".
func (a *app) selected(name string) ([]service, error) {
	if name == "" {
		return a.services, nil
	}
	s, err := a.service(name)
	if err != nil {
		return nil, err
	}
	return []service{s}, nil
}

// APIError is a non-2xx answer of an operator endpoint.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	msg := e.Message
	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		msg += " (is ADMIN_TOKEN set to the service's token?)"
	}
	return fmt.Sprintf("%d %s: %s", e.Status, http.StatusText(e.Status), msg)
}

// call sends one request to an operator endpoint with the token and decodes
// a 2xx JSON answer into out.
func (a *app) call(ctx context.Context, method, url string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encoding the request: %w", err)
		}
		body = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return fmt.Errorf("building the request: %w", err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, url, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		apiErr := &APIError{Status: resp.StatusCode, Message: strings.TrimSpace(string(raw))}
		if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
			apiErr.Code, apiErr.Message = e.Error.Code, e.Error.Message
		}
		if len(apiErr.Message) > 300 {
			apiErr.Message = apiErr.Message[:300] + "…"
		}
		return fmt.Errorf("%s %s: %w", method, url, apiErr)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, url, err)
	}
	return nil
}

// table writes rows aligned under header.
func (a *app) table(header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func (a *app) writeJSON(v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// age formats how long ago t was, to the second.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(time.Second).String()
}

func newFlags(name string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("onceflowctl "+name, flag.ContinueOnError)
	fs.SetOutput(out)
	return fs
}
