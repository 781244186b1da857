package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// report prints a run's tables and writes what it writes: the JSON and
// the lag plot when fresh (a run that just measured, not a rewrite from
// its JSON), BENCHMARKS.md's sections (the headline and details when the
// main parts ran, the knobs' and the peers' when those did) and each
// section's copy in the history.
func report(o options, res Results, fresh bool, stdout io.Writer, say func(string, ...any)) error {
	root := o.root
	ran := ranParts(res)
	mainRan := false
	for _, p := range defaultParts {
		mainRan = mainRan || ran[p]
	}
	started := res.Started
	if started.IsZero() {
		started = time.Now()
	}
	keep := func(part, title string, sections ...string) error {
		if o.out == "" || o.history == "" {
			return nil
		}
		path, err := writeHistory(root, o.history, started, part, title, sections...)
		if err != nil {
			return fmt.Errorf("keeping the %s section in %s: %w", part, o.history, err)
		}
		say("kept it in %s", path)
		return nil
	}
	if mainRan {
		headline := headlineMarkdown(headlineInput{res: res, ran: ran, latestPeers: latestPeers(o)})
		fmt.Fprintln(stdout)
		fmt.Fprintln(stdout, headline)
		fmt.Fprintln(stdout, libraryTable(res))
		if t := modesTable(res); t != "" {
			fmt.Fprintln(stdout, t)
		}
		if len(res.Runs) > 0 {
			fmt.Fprintln(stdout, e2eTable(res))
		}
		if ab := abTable(res); ab != "" {
			fmt.Fprintln(stdout, ab)
		}
		if fresh && o.jsonOut != "" {
			if err := writeJSON(at(root, o.jsonOut), res); err != nil {
				return err
			}
			say("wrote %s", o.jsonOut)
		}
		if fresh && o.svgOut != "" && len(res.Lag) > 0 {
			if err := os.MkdirAll(filepath.Dir(at(root, o.svgOut)), 0o755); err != nil {
				return err
			}
			title := fmt.Sprintf("commit → settlement lag, steady %d orders/s (outbox mode), %s", o.rate, res.Started.Format("2006-01-02 15:04 UTC"))
			if err := os.WriteFile(at(root, o.svgOut), []byte(lagSVG(res.Lag, title)), 0o644); err != nil {
				return err
			}
			say("wrote %s", o.svgOut)
		}
		if o.out != "" {
			details := detailsMarkdown(res, o)
			if err := writeHeadline(at(root, o.out), headline); err != nil {
				return err
			}
			if err := writeMarkdown(at(root, o.out), details, beginMarker, endMarker); err != nil {
				return err
			}
			say("rewrote the headline and the details of %s", o.out)
			if err := keep("make-bench", fmt.Sprintf("`make bench`, %s (generated)", res.Machine.Date), headline, details); err != nil {
				return err
			}
		}
	}
	// A part with a section of its own (knobs, peers) prints its table and
	// writes its results beside the main ones: -json's file with -<part>
	// before .json, and its section of -out.
	writePart := func(part, table, md, begin, end string) error {
		fmt.Fprintln(stdout)
		fmt.Fprintln(stdout, table)
		if fresh && o.jsonOut != "" {
			path := strings.TrimSuffix(at(root, o.jsonOut), ".json") + "-" + part + ".json"
			if err := writeJSON(path, res); err != nil {
				return err
			}
			say("wrote %s", path)
		}
		if o.out != "" {
			if err := writeMarkdown(at(root, o.out), md, begin, end); err != nil {
				return err
			}
			say("rewrote the %s section of %s", part, o.out)
			if part == "peers" && !mainRan {
				if err := notePeersRun(at(root, o.out), res.Machine.Date); err != nil {
					return err
				}
			}
			return keep(part, fmt.Sprintf("`make bench -only %s`, %s (generated)", part, res.Machine.Date), md)
		}
		return nil
	}
	if len(res.Knobs) > 0 {
		if err := writePart("knobs", knobTable(res.Knobs), knobsMarkdown(res, o), knobsBeginMarker, knobsEndMarker); err != nil {
			return err
		}
	}
	if len(res.Peers) > 0 {
		table := peersTable(res.Peers, res.PeersBig)
		if err := writePart("peers", table, peersMarkdown(res, o, table), peersBeginMarker, peersEndMarker); err != nil {
			return err
		}
	}
	return nil
}

// rewrite is -from: the page's sections and their history written again
// from an earlier run's JSON, as that run would write them today, with
// nothing run. The JSON and the plot are left as they are.
func rewrite(o options, stdout io.Writer, say func(string, ...any)) error {
	b, err := os.ReadFile(at(o.root, o.from))
	if err != nil {
		return err
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("-from %s: %w", o.from, err)
	}
	say("writing %s from %s (the run of %s), running nothing", o.out, o.from, res.Machine.Date)
	return report(o, res, false, stdout, say)
}

// latestPeers is when the latest peers run was, from its JSON beside
// -json's ("" when there is none).
func latestPeers(o options) string {
	if o.jsonOut == "" {
		return ""
	}
	b, err := os.ReadFile(strings.TrimSuffix(at(o.root, o.jsonOut), ".json") + "-peers.json")
	if err != nil {
		return ""
	}
	var res struct {
		Machine Machine `json:"machine"`
	}
	if json.Unmarshal(b, &res) != nil {
		return ""
	}
	return res.Machine.Date
}
