package testenv

import (
	"bufio"
	"encoding/json"
	"strings"
	"sync"
)

// LogBuffer collects what a program under test logs, safely across its
// goroutines.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Record returns the first JSON log record whose "msg" is msg.
func (l *LogBuffer) Record(msg string) (map[string]any, bool) {
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			return rec, true
		}
	}
	return nil, false
}
