package thirdparty

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
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
type Ledger struct {
	mu      sync.Mutex
	f       *os.File // nil: memory only
	size    int64    // bytes of whole lines in f; a failed write is cut back to it
	closed  bool
	entries []Settlement
	byKey   map[string][]int // idempotency key -> indexes into entries
	stats   Stats
}

// OpenLedger opens the ledger stored at path, creating the file if needed and
// loading the settlements already in it. An empty path gives a memory-only
// ledger, for tests.
//
// A last line without its newline is a write torn by a crash; it was never
// acknowledged to a caller, so it is cut off rather than treated as corruption.
// Any other unreadable line is an error: an audit must not silently skip data.
func OpenLedger(path string) (*Ledger, error) {
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
	l.f = f
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
	line = append(line, '\n')

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return Settlement{}, 0, ErrLedgerClosed
	}
	if l.f != nil {
		if err := l.write(line); err != nil {
			return Settlement{}, 0, err
		}
	}
	l.add(s)
	return s, len(l.byKey[s.IdempotencyKey]), nil
}

// write appends line durably. On failure it cuts the file back to its last
// whole line, so a half-written record cannot corrupt the next one.
func (l *Ledger) write(line []byte) error {
	_, err := l.f.Write(line)
	if err == nil {
		err = l.f.Sync()
	}
	if err != nil {
		if terr := l.f.Truncate(l.size); terr != nil {
			err = errors.Join(err, fmt.Errorf("cutting back: %w", terr))
		}
		return fmt.Errorf("writing ledger: %w", err)
	}
	l.size += int64(len(line))
	return nil
}

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

// Close closes the ledger file; reads keep working, Append fails.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.f == nil {
		return nil
	}
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("closing ledger: %w", err)
	}
	return nil
}
