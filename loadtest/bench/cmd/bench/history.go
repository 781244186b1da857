package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Every section make bench writes into BENCHMARKS.md is also kept, as it
// was written, in the history directory (-history, benchmarks/history): the
// page shows only the latest run, so overwriting it must not lose the one
// before. One file per run and part, named by the run's start,
// <yyyy-mm-dd>-<hhmm>-<part>.md, so two runs of a day are both kept.

const (
	historyIndexBeginMarker = "<!-- make bench: history index begin -->"
	historyIndexEndMarker   = "<!-- make bench: history index end -->"
)

// historyName is the file a run's part is kept in.
func historyName(started time.Time, part string) string {
	return started.UTC().Format("2006-01-02-1504") + "-" + part + ".md"
}

// historyFile matches the files make bench writes to the history.
var historyFile = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}-\d{4}-[a-z-]+\.md$`)

// markdownLink matches a Markdown link or image target.
var markdownLink = regexp.MustCompile(`(!?\[[^\]]*\])\(([^)]+)\)`)

// relink makes the relative links of a section written for the page (at
// the repository's root) work from a file in dir (relative to the root);
// an in-page anchor points at the page's section (the latest run's).
func relink(section, dir string) string {
	depth := len(strings.Split(filepath.ToSlash(filepath.Clean(dir)), "/"))
	up := strings.Repeat("../", depth)
	return markdownLink.ReplaceAllStringFunc(section, func(m string) string {
		sub := markdownLink.FindStringSubmatch(m)
		target := sub[2]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "/") {
			return m
		}
		if strings.HasPrefix(target, "#") {
			target = "BENCHMARKS.md" + target
		}
		return sub[1] + "(" + up + target + ")"
	})
}

// writeHistory keeps sections (the page's, as written) in dir under the
// run's name for part, with the markers dropped and a title, and rewrites
// dir's index. dir is relative to root.
func writeHistory(root, dir string, started time.Time, part, title string, sections ...string) (string, error) {
	abs := at(root, dir)
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s\n\n", title)
	fmt.Fprintf(&b, "Written by `make bench` when it wrote this into [BENCHMARKS.md](%sBENCHMARKS.md); the raw numbers are\n"+
		"`benchmarks/results*.json` at the commit that added this file; its links to the page's sections lead to the\n"+
		"latest run's.\n", strings.Repeat("../", len(strings.Split(filepath.ToSlash(filepath.Clean(dir)), "/"))))
	for _, s := range sections {
		var kept []string
		for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
			switch {
			case strings.HasPrefix(line, "<!-- make bench"):
			case line == headlineTitle: // here it is no longer the latest
				kept = append(kept, "## Headline")
			case line == detailsTitle:
				kept = append(kept, "## In detail")
			default:
				kept = append(kept, line)
			}
		}
		b.WriteString("\n" + relink(strings.Join(kept, "\n"), dir) + "\n")
	}
	name := historyName(started, part)
	if err := os.WriteFile(filepath.Join(abs, name), b.Bytes(), 0o644); err != nil {
		return "", err
	}
	return filepath.Join(dir, name), writeHistoryIndex(abs)
}

// writeHistoryIndex lists the files make bench wrote to dir, newest first,
// with each one's title, between the index markers of dir's README.md.
func writeHistoryIndex(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if historyFile.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	var b bytes.Buffer
	b.WriteString(historyIndexBeginMarker + "\n")
	for _, n := range names {
		title := n
		if f, err := os.ReadFile(filepath.Join(dir, n)); err == nil {
			first, _, _ := strings.Cut(string(f), "\n")
			title = cmpOr(strings.TrimSpace(strings.TrimPrefix(first, "# ")), n)
		}
		fmt.Fprintf(&b, "- [%s](%s): %s\n", n, n, title)
	}
	b.WriteString(historyIndexEndMarker + "\n")
	return writeMarkdown(filepath.Join(dir, "README.md"), b.String(), historyIndexBeginMarker, historyIndexEndMarker)
}

// writeHeadline replaces the headline of path, or, on a page without one,
// puts it right under the page's title: it is the first screen.
func writeHeadline(path, section string) error {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(b)
	if strings.Contains(s, headlineBeginMarker) && strings.Contains(s, headlineEndMarker) {
		return writeMarkdown(path, section, headlineBeginMarker, headlineEndMarker)
	}
	title, rest, _ := strings.Cut(s, "\n")
	if !strings.HasPrefix(title, "# ") {
		title, rest = "# Benchmarks", s
	}
	s = title + "\n\n" + strings.TrimSuffix(section, "\n") + "\n\n" + strings.TrimLeft(rest, "\n")
	return os.WriteFile(path, []byte(strings.TrimRight(s, "\n")+"\n"), 0o644)
}

// latestPeersNote matches the date a headline gives for the latest peers
// run when its own run had none.
var latestPeersNote = regexp.MustCompile(`(the latest peers run: )([^(|]+?)( \()`)

// notePeersRun points a headline written without the peers part at a
// peers run made since (-only peers writes no headline: the headline is one
// run's, whole).
func notePeersRun(path, date string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	s := latestPeersNote.ReplaceAllString(string(b), "${1}"+date+"${3}")
	if s == string(b) {
		return nil
	}
	return os.WriteFile(path, []byte(s), 0o644)
}
