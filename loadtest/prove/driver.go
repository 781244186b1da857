package prove

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// Driver places orders through the orders API as a careful client does: each
// order has an Idempotency-Key, and a request that fails (the process died,
// the database is down) is retried with the same key until it is accepted.
type Driver struct {
	url    string
	prefix string
	client http.Client

	// CancelEvery, when above 0, cancels every CancelEvery-th order right
	// after it was placed, so that its aggregate has two events (OrderPlaced,
	// OrderCancelled) close together, whose order billing and the third
	// party must keep. Set it before Drive.
	CancelEvery int

	next      atomic.Int64
	cancelled atomic.Int64
	mu        sync.Mutex
	accepted  map[uuid.UUID]time.Time
	gaveUp    int
	retries   int
}

func newDriver(url, prefix string) *Driver {
	return &Driver{url: url, prefix: prefix, client: http.Client{Timeout: 10 * time.Second},
		accepted: map[uuid.UUID]time.Time{}}
}

// Drive places orders with workers in parallel, at most rate per second (0:
// as fast as they go), until max were placed, or at least min were placed
// and done (if not nil) holds, or ctx ends.
func (d *Driver) Drive(ctx context.Context, workers, rate, min, max int, done func() bool) {
	var tick <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		tick = t.C
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if tick != nil {
					select {
					case <-ctx.Done():
						return
					case <-tick:
					}
				}
				n := d.next.Add(1)
				if int(n) > max || (done != nil && int(n) > min && done()) {
					return
				}
				id, ok := d.PlaceOne(ctx, n)
				if ok && d.CancelEvery > 0 && n%int64(d.CancelEvery) == 0 {
					d.CancelOne(ctx, id)
				}
			}
		}()
	}
	wg.Wait()
}

// PlaceOne places order n, retrying for up to three minutes, and returns its id.
func (d *Driver) PlaceOne(ctx context.Context, n int64) (uuid.UUID, bool) {
	body, _ := json.Marshal(map[string]any{
		"customerId": fmt.Sprintf("customer-%d", n%97), "amountCents": 100 + n, "currency": "EUR",
	})
	key := fmt.Sprintf("%s-%d", d.prefix, n)
	deadline := time.Now().Add(3 * time.Minute)
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil || time.Now().After(deadline) {
			d.mu.Lock()
			d.gaveUp++
			d.mu.Unlock()
			return uuid.Nil, false
		}
		if attempt > 0 {
			d.mu.Lock()
			d.retries++
			d.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(50+attempt*50%500) * time.Millisecond):
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/orders", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := d.client.Do(req)
		if err != nil {
			continue
		}
		var o struct {
			ID uuid.UUID `json:"id"`
		}
		err = json.NewDecoder(resp.Body).Decode(&o)
		resp.Body.Close()
		if (resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusOK) && err == nil && o.ID != uuid.Nil {
			d.mu.Lock()
			d.accepted[o.ID] = time.Now()
			d.mu.Unlock()
			return o.ID, true
		}
	}
}

// CancelOne cancels order id, retrying for up to three minutes (a cancel
// is idempotent: cancelling a cancelled order changes nothing).
func (d *Driver) CancelOne(ctx context.Context, id uuid.UUID) bool {
	deadline := time.Now().Add(3 * time.Minute)
	for attempt := 0; ctx.Err() == nil && time.Now().Before(deadline); attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(50+attempt*50%500) * time.Millisecond):
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/orders/"+id.String()+"/cancel", nil)
		resp, err := d.client.Do(req)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			d.cancelled.Add(1)
			return true
		}
	}
	return false
}

// Cancelled is how many cancels the API acknowledged.
func (d *Driver) Cancelled() int { return int(d.cancelled.Load()) }

// Accepted returns the ids of the orders the API acknowledged.
func (d *Driver) Accepted() map[uuid.UUID]time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[uuid.UUID]time.Time, len(d.accepted))
	for k, v := range d.accepted {
		out[k] = v
	}
	return out
}

// Stats returns how many orders were acknowledged, given up and retried.
func (d *Driver) Stats() (accepted, gaveUp, retries int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.accepted), d.gaveUp, d.retries
}
