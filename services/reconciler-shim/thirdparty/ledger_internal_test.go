package thirdparty

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestConcurrentBookingsShareFsyncsAndEachIsDurableWhenAnswered(t *testing.T) {
	const bookings = 64
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	// The first fsync waits until every booking has been sent (as a slow
	// disk would keep them queued), and each records what it made durable:
	// the file's content at the moment it returned.
	var (
		mu        sync.Mutex
		durable   []byte
		sent      atomic.Int32
		allSent   = make(chan struct{})
		firstSync sync.Once
	)
	slowSync := func(f *os.File) error {
		firstSync.Do(func() {
			select {
			case <-allSent:
			case <-time.After(10 * time.Second):
			}
		})
		if err := f.Sync(); err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		mu.Lock()
		durable = b
		mu.Unlock()
		return nil
	}
	l, err := openLedger(path, slowSync)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })

	var wg sync.WaitGroup
	errs := make(chan error, bookings)
	notDurable := make(chan string, bookings)
	for i := range bookings {
		wg.Go(func() {
			if sent.Add(1) == bookings {
				close(allSent)
			}
			// Two bookings per key: the stand-in stays NOT idempotent.
			s, err := l.Append(Settlement{IdempotencyKey: string(rune('a' + i%(bookings/2))), PaymentID: "p", OrderID: "o",
				Kind: KindCapture, AmountCents: 100, Currency: "EUR"})
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			ok := bytes.Contains(durable, []byte(s.ID))
			mu.Unlock()
			if !ok {
				notDurable <- s.ID
			}
		})
	}
	wg.Wait()
	close(errs)
	close(notDurable)
	for err := range errs {
		t.Fatal(err)
	}
	for id := range notDurable {
		t.Errorf("booking %s was answered before an fsync covered it", id)
	}
	if st := l.Stats(); st.Settlements != bookings || st.Duplicates != bookings/2 {
		t.Fatalf("Stats() = %+v, want %d settlements, %d of them duplicates", st, bookings, bookings/2)
	}
	syncs := l.Syncs()
	if syncs >= bookings {
		t.Fatalf("%d concurrent bookings took %d fsyncs, want fewer (group commit)", bookings, syncs)
	}
	t.Logf("%d concurrent bookings, %d fsyncs", bookings, syncs)

	// Everything answered is in the file, whole.
	_ = l.Close()
	reopened, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.Close()
	if got := reopened.Stats(); got != l.Stats() {
		t.Fatalf("reopened: %+v, want %+v", got, l.Stats())
	}
}
