package thirdparty

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// The settlement kinds the third party books.
const (
	KindCapture = "capture"
	KindRefund  = "refund"
)

// Settlement is one booking as the third party recorded it. Two settlements
// with the same IdempotencyKey are a duplicate: the payment was booked twice.
type Settlement struct {
	// ID is assigned by the ledger; it tells apart duplicates under one key.
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey"`
	PaymentID      string    `json:"paymentId"`
	OrderID        string    `json:"orderId"`
	Kind           string    `json:"kind"`
	AmountCents    int64     `json:"amountCents"`
	Currency       string    `json:"currency"`
	ReceivedAt     time.Time `json:"receivedAt"`
	// TraceID is the W3C trace id of the request that booked it, when the
	// caller sent a traceparent: the trace to open to see how it got here.
	TraceID string `json:"traceId,omitempty"`
}

// Stats summarises a ledger for an audit.
type Stats struct {
	Settlements int `json:"settlements"`
	UniqueKeys  int `json:"uniqueKeys"`
	// Duplicates is Settlements - UniqueKeys: the bookings the shim should
	// have prevented. An exactly-once run ends with zero.
	Duplicates int `json:"duplicates"`
	Captures   int `json:"captures"`
	Refunds    int `json:"refunds"`
}

// ErrLedgerClosed is returned by Append after Close.
var ErrLedgerClosed = errors.New("ledger is closed")

// Ledger is the third party's append-only record of every settlement it
// received, duplicates included. It is safe for concurrent use.
//
// With a file behind it, each settlement is one JSON line, written and
// fsynced before Append returns, so that a settlement the server
// acknowledged survives a kill -9 of the stand-in and the audit still counts it.
// Concurrent bookings share fsyncs (group commit): one goroutine writes
// and fsyncs the bookings queued so far as one group, and those arriving
// while it does go in the next group. A booking is answered, and visible
// to ByKey, only once its group's fsync returned.
type Ledger struct {
	mu      sync.Mutex
	f       *os.File // nil: memory only
	size    int64    // bytes of whole, synced lines in f; a failed group is cut back to it
	closed  bool
	entries []Settlement
	byKey   map[string][]int // idempotency key -> indexes into entries
	stats   Stats

	// Group commit, with a file only.
	next    *syncGroup    // bookings waiting for the next write and fsync
	wake    chan struct{} // tells the syncer there is a group (1-buffered)
	stopped chan struct{} // closed when the syncer has returned
	sync    func(*os.File) error
	syncs   atomic.Int64
}

// syncGroup is bookings written and fsynced together.
type syncGroup struct {
	buf     []byte // their lines
	entries []Settlement
	counts  []int // per entry: the settlements its key has, counting it
	err     error
	done    chan struct{} // closed once the group is durable or failed
}

// OpenLedger opens the ledger stored at path, creating the file if needed and
// loading the settlements already in it. An empty path gives a memory-only
// ledger, for tests.
//
// A last line without its newline is a write torn by a crash; it was never
// acknowledged to a caller, so it is cut off rather than treated as corruption.
// Any other unreadable line is an error: an audit must not silently skip data.
func OpenLedger(path string) (*Ledger, error) {
	return openLedger(path, (*os.File).Sync)
}

// openLedger is OpenLedger with the fsync it runs per group (tests slow it
// down to see groups form).
func openLedger(path string, sync func(*os.File) error) (*Ledger, error) {
	l := &Ledger{byKey: make(map[string][]int)}
	if path == "" {
		return l, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening ledger: %w", err)
	}
	if err := l.load(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("loading ledger %s: %w", path, err)
	}
	l.f, l.sync = f, sync
	l.wake, l.stopped = make(chan struct{}, 1), make(chan struct{})
	go l.syncer()
	return l, nil
}

func (l *Ledger) load(f *os.File) error {
	r := bufio.NewReader(f)
	for lineNo := 1; ; lineNo++ {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			if len(line) > 0 {
				if err := f.Truncate(l.size); err != nil {
					return fmt.Errorf("cutting off torn last line: %w", err)
				}
			}
			return nil
		}
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(line)) > 0 {
			var s Settlement
			if err := json.Unmarshal(line, &s); err != nil {
				return fmt.Errorf("line %d: %w", lineNo, err)
			}
			l.add(s)
		}
		l.size += int64(len(line))
	}
}

// Append books s, assigning its ID and, when zero, its ReceivedAt, and
// returns the settlement as stored. It never refuses a repeated
// IdempotencyKey: that is the non-idempotent behaviour being modelled.
func (l *Ledger) Append(s Settlement) (Settlement, error) {
	s, _, err := l.append(s)
	return s, err
}

// append is Append that also reports how many settlements the key now has,
// counted under the same lock so concurrent requests cannot blur it.
func (l *Ledger) append(s Settlement) (Settlement, int, error) {
	s.ID = uuid.NewString()
	if s.ReceivedAt.IsZero() {
		s.ReceivedAt = time.Now().UTC()
	}
	line, err := json.Marshal(s)
	if err != nil {
		return Settlement{}, 0, fmt.Errorf("encoding settlement: %w", err)
	}

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return Settlement{}, 0, ErrLedgerClosed
	}
	if l.f == nil {
		defer l.mu.Unlock()
		l.add(s)
		return s, len(l.byKey[s.IdempotencyKey]), nil
	}
	g := l.next
	if g == nil {
		g = &syncGroup{done: make(chan struct{})}
		l.next = g
	}
	i := len(g.entries)
	g.buf = append(append(g.buf, line...), '\n')
	g.entries = append(g.entries, s)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default: // the syncer has a wake-up pending and will find this group
	}
	<-g.done
	if g.err != nil {
		return Settlement{}, 0, g.err
	}
	return s, g.counts[i], nil
}

// syncer writes and fsyncs the queued group, one group at a time, until the
// ledger is closed and its last group is durable.
func (l *Ledger) syncer() {
	defer close(l.stopped)
	for range l.wake {
		l.mu.Lock()
		g, closed := l.next, l.closed
		l.next = nil
		l.mu.Unlock()
		if g != nil {
			l.commit(g)
		}
		if closed {
			return
		}
	}
}

// commit appends g's lines with one write and one fsync, then makes its
// bookings visible and answers them. On failure it cuts the file back to its
// last synced line, so a half-written group cannot corrupt the next one, and
// every booking of g fails: none was acknowledged.
func (l *Ledger) commit(g *syncGroup) {
	defer close(g.done)
	_, err := l.f.Write(g.buf)
	if err == nil {
		l.syncs.Add(1)
		err = l.sync(l.f)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if terr := l.f.Truncate(l.size); terr != nil {
			err = errors.Join(err, fmt.Errorf("cutting back: %w", terr))
		}
		g.err = fmt.Errorf("writing ledger: %w", err)
		return
	}
	l.size += int64(len(g.buf))
	g.counts = make([]int, len(g.entries))
	for i, s := range g.entries {
		l.add(s)
		g.counts[i] = len(l.byKey[s.IdempotencyKey])
	}
}

// Syncs returns how many fsyncs the ledger has run: fewer than its bookings
// when concurrent bookings shared them.
func (l *Ledger) Syncs() int64 { return l.syncs.Load() }

func (l *Ledger) add(s Settlement) {
	idx := l.byKey[s.IdempotencyKey]
	if len(idx) == 0 {
		l.stats.UniqueKeys++
	} else {
		l.stats.Duplicates++
	}
	l.byKey[s.IdempotencyKey] = append(idx, len(l.entries))
	l.entries = append(l.entries, s)
	l.stats.Settlements++
	switch s.Kind {
	case KindCapture:
		l.stats.Captures++
	case KindRefund:
		l.stats.Refunds++
	}
}

// ByKey returns the settlements booked under key, oldest first; none means
// the third party never booked it.
func (l *Ledger) ByKey(key string) []Settlement {
	l.mu.Lock()
	defer l.mu.Unlock()
	idx := l.byKey[key]
	out := make([]Settlement, len(idx))
	for i, j := range idx {
		out[i] = l.entries[j]
	}
	return out
}

// All returns every settlement in the order it was booked.
func (l *Ledger) All() []Settlement {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(make([]Settlement, 0, len(l.entries)), l.entries...)
}

// Stats returns the ledger's counts.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// Ready reports whether the ledger takes bookings: nil until it is
// closed (the stand-in's /readyz check).
func (l *Ledger) Ready(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrLedgerClosed
	}
	return nil
}

// Close closes the ledger file, after the bookings already queued are
// durable and answered; reads keep working, Append fails.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
	<-l.stopped
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("closing ledger: %w", err)
	}
	return nil
}
