package onceflow

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tracker remembers the orders a run placed and which of them settled.
type tracker struct {
	mu      sync.Mutex
	all     []string             // every tracked order id, for the audit
	pending map[string]time.Time // order id → created_at, not yet settled
}

func newTracker() *tracker { return &tracker{pending: map[string]time.Time{}} }

// Track records an order the script placed: its id and its createdAt as the
// API returned it (the order row's created_at, RFC 3339).
func (c *Client) Track(id, createdAt string) error {
	at, err := time.Parse(time.RFC3339Nano, createdAt)
	if err != nil {
		return fmt.Errorf("onceflow.track: createdAt %q: %w", createdAt, err)
	}
	t := c.shared.tracker
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.pending[id]; !dup {
		t.all = append(t.all, id)
	}
	t.pending[id] = at
	return nil
}

// Unsettled is how many tracked orders the last poll had not yet seen
// settle. It reads memory only, so load VUs may call it every iteration
// (the ramp does, to stop piling up a backlog past its knee).
func (c *Client) Unsettled() int {
	t := c.shared.tracker
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// Settled is what poll returns: the orders that settled since the last
// poll, as parallel arrays (lag and placement time in milliseconds, the
// latter since the Unix epoch), and how many tracked orders still wait.
type Settled struct {
	LagMs    []float64 `js:"lagMs"`
	PlacedMs []float64 `js:"placedMs"`
	Pending  int       `js:"pending"`
	Tracked  int       `js:"tracked"`
}

// chunk bounds the ids one query carries.
const chunk = 10_000

// settledQuery finds the capture forwards of the given orders: the shim
// writes one row per payment event it forwarded to the third party, in the
// transaction that follows the call, so forwarded_at is when the payment
// reached the third party. forwards has no index on order_id; Postgres
// hashes the array, and one scan a second is cheap next to the load.
const settledQuery = `
	SELECT order_id::text, min(forwarded_at), count(*)
	FROM forwards
	WHERE kind = 'capture' AND order_id = ANY($1::uuid[])
	GROUP BY order_id`

// Poll turns the orders settled since the last poll into lag samples.
func (c *Client) Poll() (Settled, error) {
	return c.shared.tracker.poll(c.ctx(), c.shared.shim)
}

func (t *tracker) poll(ctx context.Context, shim *pgxpool.Pool) (Settled, error) {
	t.mu.Lock()
	ids := make([]string, 0, len(t.pending))
	for id := range t.pending {
		ids = append(ids, id)
	}
	t.mu.Unlock()

	var out Settled
	for len(ids) > 0 {
		n := min(chunk, len(ids))
		part := ids[:n]
		ids = ids[n:]
		rows, err := shim.Query(ctx, settledQuery, part)
		if err != nil {
			return out, fmt.Errorf("onceflow.poll: %w", err)
		}
		type found struct {
			id string
			at time.Time
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (found, error) {
			var f found
			var n int
			return f, r.Scan(&f.id, &f.at, &n)
		})
		if err != nil {
			return out, fmt.Errorf("onceflow.poll: %w", err)
		}
		t.mu.Lock()
		for _, f := range got {
			placed, ok := t.pending[f.id]
			if !ok {
				continue
			}
			delete(t.pending, f.id)
			out.LagMs = append(out.LagMs, float64(f.at.Sub(placed).Microseconds())/1000)
			out.PlacedMs = append(out.PlacedMs, float64(placed.UnixMicro())/1000)
		}
		t.mu.Unlock()
	}
	t.mu.Lock()
	out.Pending, out.Tracked = len(t.pending), len(t.all)
	t.mu.Unlock()
	return out, nil
}

// Audit is the end-of-run verdict on the tracked orders.
type Audit struct {
	Tracked int `js:"tracked"`
	// Settled orders have exactly one capture at the third party.
	Settled int `js:"settled"`
	// Lost orders have none when the wait ended.
	Lost int `js:"lost"`
	// Duplicated counts extra captures: an order settled three times adds 2.
	Duplicated int `js:"duplicated"`
	// Late holds the lags of the orders that settled while Audit waited,
	// which no poll saw; scripts add them to their lag metric.
	Late Settled `js:"late"`
	// WaitedMs is how long Audit waited for the last settlements.
	WaitedMs float64 `js:"waitedMs"`
}

// Audit waits up to timeoutMs for every tracked order to settle, then counts
// each tracked order's captures at the third party (from the shim's forwards).
func (c *Client) Audit(timeoutMs int) (Audit, error) {
	ctx := c.ctx()
	t := c.shared.tracker
	start := time.Now()
	deadline := start.Add(time.Duration(timeoutMs) * time.Millisecond)
	var a Audit
	for {
		s, err := t.poll(ctx, c.shared.shim)
		if err != nil {
			return a, err
		}
		a.Late.LagMs = append(a.Late.LagMs, s.LagMs...)
		a.Late.PlacedMs = append(a.Late.PlacedMs, s.PlacedMs...)
		if s.Pending == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return a, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	a.WaitedMs = float64(time.Since(start).Milliseconds())

	t.mu.Lock()
	ids := append([]string(nil), t.all...)
	t.mu.Unlock()
	a.Tracked = len(ids)
	for len(ids) > 0 {
		n := min(chunk, len(ids))
		part := ids[:n]
		ids = ids[n:]
		rows, err := c.shared.shim.Query(ctx, settledQuery, part)
		if err != nil {
			return a, fmt.Errorf("onceflow.audit: %w", err)
		}
		counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (int, error) {
			var id string
			var at time.Time
			var n int
			return n, r.Scan(&id, &at, &n)
		})
		if err != nil {
			return a, fmt.Errorf("onceflow.audit: %w", err)
		}
		for _, n := range counts {
			a.Settled++
			a.Duplicated += n - 1
		}
	}
	a.Lost = a.Tracked - a.Settled
	t.mu.Lock()
	a.Late.Pending, a.Late.Tracked = len(t.pending), len(t.all)
	t.mu.Unlock()
	return a, nil
}
