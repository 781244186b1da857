package prove_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/loadtest/prove"
	"github.com/onceflow/onceflow/platform/harness"
)

// TestQuickProofs runs every proof in the quick profile, the version `make
// test` runs: the outbox/inbox rows must pass, and the naive rows must lose
// or duplicate (a naive mode that survives means the proof does not bite).
// It starts its own PostgreSQL and Kafka with devstack/stack.sh, as `make
// prove` does, so it needs what `make up` needs (Go, Java 17+, Maven,
// PostgreSQL; stack.sh installs the missing ones on Debian as root).
// ONCEFLOW_PROVE_ONLY (comma-separated proof names) runs only those;
// ONCEFLOW_PROVE_PARALLEL sets Options.Parallel (default 3: the proofs that
// leave the stack alone go three at a time, each on its own platform).
func TestQuickProofs(t *testing.T) {
	root := harness.Root(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	var only []string
	if v := os.Getenv("ONCEFLOW_PROVE_ONLY"); v != "" {
		only = strings.Split(v, ",")
	} else {
		// The nemesis has a test of its own (TestQuickNemesis), so that its
		// findings are reported as findings, not as one failed row among many.
		for _, p := range prove.Proofs {
			if p.Name != "nemesis" {
				only = append(only, p.Name)
			}
		}
	}
	parallel := int(envInt(t, "ONCEFLOW_PROVE_PARALLEL", 3))
	rep := runQuick(t, ctx, prove.Options{Root: root, Dir: filepath.Join(root, ".prove", "test"),
		Profile: prove.Profiles["quick"], Out: &lineLogger{t: t}, Only: only, Parallel: parallel})

	want := map[string]bool{}
	for _, p := range prove.Proofs {
		if len(only) > 0 && !slices.Contains(only, p.Name) {
			continue
		}
		want[p.Name+"/safe"] = true
		if p.Naive != "" {
			want[p.Name+"/naive"] = true
		}
	}
	for _, r := range rep.Rows {
		key := r.Proof + "/safe"
		if r.Naive {
			key = r.Proof + "/naive"
		}
		delete(want, key)
		switch {
		case r.Naive && r.Status != prove.Bites:
			t.Errorf("%s (%s): %s; a naive mode must lose or duplicate under the fault (lost %d, duplicated %d)",
				r.Proof, r.Mode, r.Status, r.Lost, r.Duplicated)
		case !r.Naive && r.Status != prove.Pass:
			t.Errorf("%s (%s): %s %s; broken: %s", r.Proof, r.Mode, r.Status, r.Error, strings.Join(r.Broken(), "; "))
		}
		if r.Faults == 0 {
			t.Errorf("%s (%s) injected no fault", r.Proof, r.Mode)
		}
	}
	for missing := range want {
		t.Errorf("no report row for %s", missing)
	}
}

// runQuick runs the proofs opts names and logs the report's table. A
// harness that could not run is no finding: t fails saying where to look.
func runQuick(t *testing.T, ctx context.Context, opts prove.Options) *prove.Report {
	t.Helper()
	rep, err := prove.Run(ctx, opts)
	if err != nil {
		t.Fatalf("the harness could not run (not a finding): %v\n(it starts PostgreSQL and Kafka with devstack/stack.sh: "+
			"run `make up` once to see what is missing, and see docs/proofs.md)", err)
	}
	var table bytes.Buffer
	rep.Table(&table)
	t.Logf("\n%s", table.String())
	return rep
}

// envInt is the integer the environment variable name holds, or def when it
// is unset; anything else fails t.
func envInt(t *testing.T, name string, def int64) int64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

// lineLogger sends the harness's progress to t.Log, a line at a time.
type lineLogger struct {
	t   *testing.T
	mu  sync.Mutex
	buf []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.t.Log(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
}
