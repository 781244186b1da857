package rig

import (
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A command name with a space and a ')' of its own; utime 250, stime 50,
	// cutime 1000, cstime 20 ticks.
	line := "4242 (post (gres) x) S 18870 4242 4242 0 -1 4194560 1 0 0 0 250 50 1000 20 20 0 1 0 100 0 0\n"
	s, err := parseProcStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != 4242 || s.PPID != 18870 || s.Comm != "post (gres) x" || s.CPU != 3*time.Second || s.ChildrenCPU != 10200*time.Millisecond {
		t.Fatalf("parsed %+v", s)
	}
	for _, bad := range []string{"", "4242 no parens", "4242 (x) S 1 2"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("parseProcStat(%q) accepted it", bad)
		}
	}
}

func TestTreeCPUCountsTheRootItsReapedAndItsLiveChildren(t *testing.T) {
	stats := []ProcStat{
		{PID: 10, PPID: 1, CPU: time.Second, ChildrenCPU: 5 * time.Second}, // the postmaster
		{PID: 11, PPID: 10, CPU: 2 * time.Second},                          // a backend
		{PID: 12, PPID: 10, CPU: 3 * time.Second, ChildrenCPU: time.Hour},  // its reaped children are not the server's
		{PID: 13, PPID: 11, CPU: time.Hour},                                // not a child of the root
		{PID: 20, PPID: 1, CPU: time.Hour},                                 // another server
	}
	got, ok := TreeCPU(stats, 10)
	if !ok || got != 11*time.Second {
		t.Fatalf("TreeCPU = %v, %v; want 11 s", got, ok)
	}
	if _, ok := TreeCPU(stats, 99); ok {
		t.Error("a pid not running was found")
	}
}

func TestListeningInodes(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:E6E4 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D888 00000000:0000 0A 00000000:00000000 00:00000000 00000000   105        0 222 1 0000000000000000 100 0 0 10 0
   2: 0100007F:E6E4 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0000000000000000 20 4 30 10 -1
`
	// 0xE6E4 is 59108, 0xD888 is 55432.
	if got := listeningInodes([]byte(table), 55432); len(got) != 1 || got[0] != "222" {
		t.Errorf("port 55432: %v, want [222]", got)
	}
	if got := listeningInodes([]byte(table), 59108); len(got) != 1 || got[0] != "111" {
		t.Errorf("port 59108: %v, want [111] (333 is an established connection)", got)
	}
	if got := listeningInodes([]byte(table), 1); len(got) != 0 {
		t.Errorf("port 1: %v, want none", got)
	}
}
