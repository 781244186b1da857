package prove

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/onceflow/onceflow/loadtest/prove/check"
	"github.com/onceflow/onceflow/platform/pgroles"
)

// The reconciliation report (`make reconcile`, tools/cmd/reconcile) as the
// nemesis's operator runs it: mid-run, as one of the operator actions,
// where a finding is expected (faults are on) and only logged; and once at
// the end, after the runbook's requeues, where the platform must be
// consistent, so whatever it still reports is a finding of the checker's
// (check.KindReconcile). It reads as the read-only role the checker's
// read-back uses, so it cannot change anything.

// reconcileTimeout bounds one report: mid-run, a database that is down
// makes it fail, which is recorded, not waited out.
const reconcileTimeout = time.Minute

// buildReconcile compiles tools/cmd/reconcile into the run's bin directory.
func (h *Harness) buildReconcile(ctx context.Context) (string, error) {
	bin := filepath.Join(h.opts.Dir, "bin", "reconcile")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./tools/cmd/reconcile")
	cmd.Dir = h.opts.Root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building tools/cmd/reconcile: %w\n%s", err, out)
	}
	return bin, nil
}

// readerURLs grants the nemesis's read-only role read access to the three
// databases and returns its URL for each service (orders, billing, shim).
func (h *Harness) readerURLs(ctx context.Context, p *Platform) (map[string]string, error) {
	urls := map[string]string{}
	for svc, db := range map[string]string{"orders": p.OrdersDB, "billing": p.BillingDB, "shim": p.ShimDB} {
		spec := pgroles.ForService(svc, db, svc+"_owner", svc+"_app", nemesisReader)
		h.rolesMu.Lock()
		err := pgroles.Ensure(ctx, h.stack.PGURL("postgres", false), spec)
		h.rolesMu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("granting %s read access to %s: %w", nemesisReader.Name, db, err)
		}
		urls[svc] = roleURL(h.stack.PGURL(db, false), nemesisReader, db)
	}
	return urls, nil
}

// reconcileReport is the part of the report (-o json) the nemesis reads.
type reconcileReport struct {
	Findings []struct {
		Kind      string   `json:"kind"`
		Component string   `json:"component"`
		Count     int      `json:"count"`
		Samples   []string `json:"samples"`
	} `json:"findings"`
}

// problems lists the findings with a count, one line each.
func (r reconcileReport) problems() []string {
	var out []string
	for _, f := range r.Findings {
		if f.Count == 0 {
			continue
		}
		line := fmt.Sprintf("%s in %s: %d", f.Kind, f.Component, f.Count)
		if len(f.Samples) > 0 {
			line += " (" + strings.Join(f.Samples, ", ") + ")"
		}
		out = append(out, line)
	}
	return out
}

// reconcile runs the report with args (thresholds) and returns what it
// found; an error when it could not produce a report.
func (n *nemesisRun) reconcile(ctx context.Context, args ...string) ([]string, error) {
	if n.reconcileBin == "" {
		return nil, errors.New("the reconcile program was not built")
	}
	urls, err := n.h.readerURLs(ctx, n.p)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, reconcileTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.reconcileBin, append([]string{"-o", "json"}, args...)...)
	cmd.Env = []string{
		"ONCEFLOW_RECONCILE_ORDERS_URL=" + urls["orders"], "ONCEFLOW_RECONCILE_BILLING_URL=" + urls["billing"],
		"ONCEFLOW_RECONCILE_SHIM_URL=" + urls["shim"], "ONCEFLOW_LEDGER_URL=" + n.p.Recon.URL(),
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	// With findings it prints the report and exits 1; without a report on
	// stdout, it could not reconcile.
	var rep reconcileReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Findings == nil {
		return nil, fmt.Errorf("reconcile printed no report (%v): %s", runErr, strings.TrimSpace(lastLine(stderr.String())))
	}
	return rep.problems(), nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// reconcileMidRun is the operator action: `make reconcile` as an operator
// runs it, with its default thresholds, while faults are on.
func (n *nemesisRun) reconcileMidRun(ctx context.Context) (string, error) {
	problems, err := n.reconcile(ctx)
	switch {
	case err != nil:
		return "reconcile: no report", err
	case len(problems) == 0:
		return "reconcile: clean", nil
	}
	return "reconcile (mid-run, not judged): " + strings.Join(problems, "; "), nil
}

// endOfRunThresholds make the last report judge everything: with the
// faults gone and the platform quiet, every order is charged, forwarded and
// booked, and no row is pending, however young. In every relay mode: the
// outbox's Backlog counts what is not yet published, and in cdc mode that
// is commit-ordered (published_xmin), like the audit's pendingQuery, which
// waitQuiet waits on, so a quiet run has no published row left pending.
func endOfRunThresholds() []string {
	return []string{"-lease-grace", "1ms", "-charge-after", "1ms", "-settle-after", "1ms", "-outbox-stuck-after", "1ms"}
}

// reconcileEnd runs the report after the end-of-run requeues and records it
// for the checker.
func (n *nemesisRun) reconcileEnd(ctx context.Context) error {
	problems, err := n.reconcile(ctx, endOfRunThresholds()...)
	if err != nil {
		return fmt.Errorf("the end-of-run reconciliation: %w", err)
	}
	rec := check.Record{Kind: check.KindReconcile, At: time.Now(), Outcome: check.Clean}
	if len(problems) > 0 {
		rec.Outcome, rec.Detail = check.Findings, strings.Join(problems, "; ")
	}
	n.hist.add(rec)
	n.h.logf("  end-of-run reconciliation: %s %s", rec.Outcome, rec.Detail)
	return nil
}
