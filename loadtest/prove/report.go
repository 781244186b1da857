package prove

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// Status of a row.
const (
	Pass   = "PASS"    // an outbox/inbox row whose invariants held
	Fail   = "FAIL"    // an outbox/inbox row whose invariants broke
	Bites  = "BITES"   // a naive row that lost or duplicated, as it must
	NoBite = "NO-BITE" // a naive row that survived the fault: the proof is not biting (a harness failure)
)

// Row is one proof run in one mode.
type Row struct {
	Proof string `json:"proof"`
	// Mode is "outbox+inbox" or the naive part ("naive publish", "naive consumer").
	Mode string `json:"mode"`
	// Faults is how many faults were injected: crashes (SIGKILLs), kills,
	// restarts, network faults, third-party faults, poison messages.
	Faults     int    `json:"faults"`
	FaultsDesc string `json:"faultsDesc"`
	Orders     int    `json:"orders"`
	Lost       int    `json:"lost"`
	Duplicated int    `json:"duplicated"`
	OutOfOrder int    `json:"outOfOrder"`
	// Absorbed is how many duplicate deliveries the inboxes absorbed.
	Absorbed        int     `json:"duplicatesAbsorbed"`
	RecoverySeconds float64 `json:"recoverySeconds"`
	Status          string  `json:"status"`
	// Checks are the invariants checked, each with what was seen.
	Checks  []Check `json:"checks"`
	Seconds float64 `json:"seconds"`
	Naive   bool    `json:"naive"`
	Error   string  `json:"error,omitempty"`
}

// Check is one invariant and whether it held.
type Check struct {
	What string `json:"what"`
	OK   bool   `json:"ok"`
}

// Broken lists what the checks that did not hold say.
func (r Row) Broken() []string {
	var broken []string
	for _, c := range r.Checks {
		if !c.OK {
			broken = append(broken, c.What)
		}
	}
	return broken
}

func (r *Row) check(ok bool, format string, args ...any) {
	r.Checks = append(r.Checks, Check{What: fmt.Sprintf(format, args...), OK: ok})
}

// settle sets Status from the checks: a safe row passes when every check
// held; a naive row bites when it lost or duplicated something.
func (r *Row) settle() {
	if r.Naive {
		r.Status = NoBite
		if r.Lost+r.Duplicated+r.OutOfOrder > 0 && r.Error == "" {
			r.Status = Bites
		}
		return
	}
	r.Status = Pass
	if r.Error != "" {
		r.Status = Fail
	}
	for _, c := range r.Checks {
		if !c.OK {
			r.Status = Fail
		}
	}
}

// Report is a whole run.
type Report struct {
	Profile  string    `json:"profile"`
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Rows     []Row     `json:"rows"`
	Machine  string    `json:"machine"`
	Failures []string  `json:"failures"`
}

// OK reports whether every safe row passed and every naive row bit.
func (rep *Report) OK() bool { return len(rep.Failures) == 0 }

func (rep *Report) finish() {
	rep.Failures = nil
	for _, r := range rep.Rows {
		switch r.Status {
		case Fail:
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s (%s) failed", r.Proof, r.Mode))
		case NoBite:
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s (%s) did not bite: the naive mode survived the fault, so the proof proves nothing", r.Proof, r.Mode))
		}
	}
}

// Table writes the report as an aligned text table.
func (rep *Report) Table(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "proof\tmode\tfaults\torders\tlost\tduplicated\tout-of-order\tdups absorbed\trecovery\ttook\tresult\t")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%.0fs\t%s\t\n", r.Proof, r.Mode, r.Faults, r.Orders, r.Lost,
			r.Duplicated, r.OutOfOrder, r.Absorbed, recovery(r.RecoverySeconds), r.Seconds, r.Status)
	}
	tw.Flush()
}

func recovery(s float64) string {
	if s <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", s)
}

// Markdown writes the report with each row's faults and checks.
func (rep *Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "# Proofs report (%s profile)\n\n", rep.Profile)
	fmt.Fprintf(w, "Started %s, took %.0fs. %s\n\n", rep.Started.UTC().Format(time.RFC3339), rep.Seconds, rep.Machine)
	fmt.Fprintln(w, "| proof | mode | faults | orders | lost | duplicated | out-of-order | dups absorbed | recovery | result |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|---|")
	for _, r := range rep.Rows {
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %d | %s | **%s** |\n", r.Proof, r.Mode, r.Faults, r.Orders,
			r.Lost, r.Duplicated, r.OutOfOrder, r.Absorbed, recovery(r.RecoverySeconds), r.Status)
	}
	fmt.Fprintln(w)
	for _, r := range rep.Rows {
		fmt.Fprintf(w, "## %s — %s: %s\n\nFaults: %s. Took %.0fs.\n\n", r.Proof, r.Mode, r.Status, r.FaultsDesc, r.Seconds)
		if r.Error != "" {
			fmt.Fprintf(w, "Error: `%s`\n\n", r.Error)
		}
		for _, c := range r.Checks {
			mark := "x"
			if !c.OK {
				mark = " "
			}
			fmt.Fprintf(w, "- [%s] %s\n", mark, c.What)
		}
		fmt.Fprintln(w)
	}
	if len(rep.Failures) > 0 {
		fmt.Fprintf(w, "## Failures\n\n- %s\n", strings.Join(rep.Failures, "\n- "))
	}
}

// Write stores report.json and report.md in dir.
func (rep *Report) Write(dir string) (jsonPath, mdPath string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return "", "", err
	}
	jsonPath, mdPath = dir+"/report.json", dir+"/report.md"
	if err := os.WriteFile(jsonPath, b, 0o644); err != nil {
		return "", "", err
	}
	var md strings.Builder
	rep.Markdown(&md)
	return jsonPath, mdPath, os.WriteFile(mdPath, []byte(md.String()), 0o644)
}
