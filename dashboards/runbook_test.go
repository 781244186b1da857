package dashboards_test

import (
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// runbookBase is where the runbook_urls point: the docs on the default
// branch, so a link in a page opens the page a reader can follow.
const runbookBase = "https://github.com/onceflow/onceflow/blob/main/"

// Every alert's runbook_url opens a section that exists: a file of the
// repository under runbookBase and, after the #, the anchor GitHub gives one
// of its headings. A renamed heading or a moved page fails here, not in the
// middle of an incident.
func TestRunbookURLsResolveToADocsHeading(t *testing.T) {
	rules := loadRules(t)
	if len(rules) == 0 {
		t.Fatal("no alerts in alerts/")
	}
	anchors := map[string]map[string]bool{}
	for _, r := range rules {
		raw := r.Annotations["runbook_url"]
		u, err := url.Parse(raw)
		if err != nil || !strings.HasPrefix(raw, runbookBase) || u.Fragment == "" {
			t.Errorf("alert %s: runbook_url %q, want %s<file>#<heading anchor>", r.Alert, raw, runbookBase)
			continue
		}
		file := strings.TrimPrefix(strings.SplitN(raw, "#", 2)[0], runbookBase)
		if anchors[file] == nil {
			body, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(file)))
			if err != nil {
				t.Errorf("alert %s: runbook_url %q: %v", r.Alert, raw, err)
				continue
			}
			anchors[file] = headingAnchors(string(body))
		}
		if !anchors[file][u.Fragment] {
			t.Errorf("alert %s: runbook_url %q: %s has no heading with anchor #%s", r.Alert, raw, file, u.Fragment)
		}
	}
	// The docs' own links between runbooks resolve too.
	body, err := os.ReadFile("../docs/alerts.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\]\(([a-z-]*\.md)?#([^)]+)\)`).FindAllStringSubmatch(string(body), -1) {
		file := "docs/alerts.md"
		if m[1] != "" {
			file = "docs/" + m[1]
		}
		if anchors[file] == nil {
			b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(file)))
			if err != nil {
				t.Errorf("docs/alerts.md links to %s: %v", m[0], err)
				continue
			}
			anchors[file] = headingAnchors(string(b))
		}
		if !anchors[file][m[2]] {
			t.Errorf("docs/alerts.md links to %s: %s has no such heading", m[0], file)
		}
	}
}

// The commands an alert's description names exist: onceflowctl's commands,
// never SQL typed by hand.
func TestAlertDescriptionsNameCommandsThatExist(t *testing.T) {
	commands := map[string]bool{"status": true, "dead-letters list": true, "dead-letters requeue": true,
		"replay": true, "journey": true, "reconcile": true, "parked": true, "parked release": true, "parked skip": true}
	ctl := regexp.MustCompile(`onceflowctl ([a-z-]+)(?: (list|requeue|release|skip)\b)?`)
	sql := regexp.MustCompile(`(?i)\b(SELECT|UPDATE|INSERT|DELETE)\b.*\b(FROM|SET|INTO|WHERE)\b`)
	for _, r := range loadRules(t) {
		d := r.Annotations["description"]
		for _, m := range ctl.FindAllStringSubmatch(d, -1) {
			name := strings.TrimSpace(m[1] + " " + m[2])
			if !commands[name] {
				t.Errorf("alert %s: the description names `onceflowctl %s`, which does not exist", r.Alert, name)
			}
		}
		if sql.MatchString(d) {
			t.Errorf("alert %s: the description has SQL; name the operator command instead: %q", r.Alert, d)
		}
	}
}

// headingAnchors returns the anchors GitHub gives a markdown file's
// headings: lower case, punctuation other than - and _ dropped, spaces as
// hyphens, and -1, -2 … after repeats. Fenced code is not a heading.
func headingAnchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, c := range strings.ToLower(text) {
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
				b.WriteRune(c)
			case c == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}
