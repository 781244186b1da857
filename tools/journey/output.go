package journey

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes j as indented JSON.
func (j Journey) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(j)
}

// WriteText writes j for a person: the order, one line per step with its
// time and hop, each Kafka record's headers under it, then the problems.
func (j Journey) WriteText(w io.Writer) error {
	if o := j.Order; o != nil {
		fmt.Fprintf(w, "order %s: %s, %s for customer %s, version %d\n\n", o.ID, o.Status, money(o.AmountCents, o.Currency), o.CustomerID, o.Version)
	} else {
		fmt.Fprintf(w, "order %s: not in the orders database\n\n", j.OrderID)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME (UTC)\tHOP\tWHERE\tSTEP")
	for _, s := range j.Steps {
		hop := "-"
		if s.HopFrom != "" {
			hop = "+" + roundHop(s.Hop)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.At.UTC().Format("15:04:05.000"), hop, s.Where, s.What)
		if len(s.Headers) > 0 {
			keys := make([]string, 0, len(s.Headers))
			for k := range s.Headers {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			var kv []string
			for _, k := range keys {
				kv = append(kv, k+"="+s.Headers[k])
			}
			fmt.Fprintf(tw, "\t\t\t  headers: %s\n", strings.Join(kv, " "))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if len(j.Problems) == 0 {
		fmt.Fprintln(w, "nothing missing or odd")
	} else {
		fmt.Fprintf(w, "%d missing or odd:\n", len(j.Problems))
		for _, p := range j.Problems {
			fmt.Fprintf(w, "  - %s\n", p)
		}
	}
	for _, n := range j.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

// roundHop keeps a hop readable: microseconds below a millisecond, then
// tenths of milliseconds, then milliseconds.
func roundHop(d time.Duration) string {
	switch a := max(d, -d); {
	case a < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case a < time.Second:
		return d.Round(100 * time.Microsecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}
