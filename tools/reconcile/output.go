package reconcile

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText writes the report for a person: one aligned row per problem
// (kind, service, count, oldest age, sample ids), then each problem's
// runbook line; or one line saying there is nothing to reconcile.
func (r Report) WriteText(w io.Writer) error {
	problems := r.Problems()
	if len(problems) == 0 {
		_, err := fmt.Fprintf(w, "nothing to reconcile (%d checks at %s)\n", len(r.Findings), r.At.UTC().Format(time.RFC3339))
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tCOMPONENT\tCOUNT\tOLDEST\tSAMPLES")
	for _, f := range problems {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", f.Kind, f.Component, f.Count, f.OldestAge, strings.Join(f.Samples, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nWhat to do (docs/reconciliation.md):")
	seen := map[string]bool{}
	for _, f := range problems {
		if !seen[f.Kind] {
			seen[f.Kind] = true
			fmt.Fprintf(w, "  %s: %s\n", f.Kind, f.Runbook)
		}
	}
	return nil
}

// WriteJSON writes the whole report, clean checks included, for scripts.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
