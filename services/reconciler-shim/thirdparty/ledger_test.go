package thirdparty_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

func settlement(key, kind string) thirdparty.Settlement {
	return thirdparty.Settlement{
		IdempotencyKey: key, PaymentID: "pay-" + key, OrderID: "ord-" + key,
		Kind: kind, AmountCents: 1250, Currency: "EUR",
	}
}

func openLedger(t *testing.T, path string) *thirdparty.Ledger {
	t.Helper()
	l, err := thirdparty.OpenLedger(path)
	if err != nil {
		t.Fatalf("OpenLedger(%q): %v", path, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func mustAppend(t *testing.T, l *thirdparty.Ledger, s thirdparty.Settlement) thirdparty.Settlement {
	t.Helper()
	got, err := l.Append(s)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return got
}

func TestLedgerCountsSameKeyTwiceAsOneDuplicate(t *testing.T) {
	l := openLedger(t, "")
	first := mustAppend(t, l, settlement("a", thirdparty.KindCapture))
	second := mustAppend(t, l, settlement("a", thirdparty.KindCapture))
	mustAppend(t, l, settlement("b", thirdparty.KindRefund))

	want := thirdparty.Stats{Settlements: 3, UniqueKeys: 2, Duplicates: 1, Captures: 2, Refunds: 1}
	if got := l.Stats(); got != want {
		t.Fatalf("Stats() = %+v, want %+v", got, want)
	}
	byKey := l.ByKey("a")
	if len(byKey) != 2 || byKey[0].ID != first.ID || byKey[1].ID != second.ID {
		t.Fatalf("ByKey(a) = %+v, want the two settlements in booking order", byKey)
	}
	if first.ID == "" || first.ID == second.ID || first.ReceivedAt.IsZero() {
		t.Fatalf("Append must assign distinct IDs and a receive time, got %+v and %+v", first, second)
	}
	if got := l.ByKey("never"); len(got) != 0 {
		t.Fatalf("ByKey(never) = %+v, want none", got)
	}
}

func TestLedgerReloadsFromFileAfterReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l, err := thirdparty.OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	var booked []thirdparty.Settlement
	for _, s := range []thirdparty.Settlement{
		settlement("a", thirdparty.KindCapture),
		settlement("a", thirdparty.KindCapture),
		settlement("b", thirdparty.KindRefund),
	} {
		booked = append(booked, mustAppend(t, l, s))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	reopened := openLedger(t, path)
	all := reopened.All()
	if len(all) != len(booked) {
		t.Fatalf("reloaded %d settlements, want %d", len(all), len(booked))
	}
	for i := range booked {
		if all[i].ID != booked[i].ID || !all[i].ReceivedAt.Equal(booked[i].ReceivedAt) ||
			all[i].IdempotencyKey != booked[i].IdempotencyKey || all[i].AmountCents != booked[i].AmountCents {
			t.Errorf("settlement %d: reloaded %+v, booked %+v", i, all[i], booked[i])
		}
	}
	want := thirdparty.Stats{Settlements: 3, UniqueKeys: 2, Duplicates: 1, Captures: 2, Refunds: 1}
	if got := reopened.Stats(); got != want {
		t.Fatalf("Stats() after reopen = %+v, want %+v", got, want)
	}

	// A key booked before the restart still counts against one booked after it.
	mustAppend(t, reopened, settlement("b", thirdparty.KindRefund))
	if got := reopened.Stats().Duplicates; got != 2 {
		t.Fatalf("Duplicates after re-booking b = %d, want 2", got)
	}
}

func TestLedgerCutsOffTornLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l, err := thirdparty.OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, settlement("a", thirdparty.KindCapture))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"id":"torn","idempotencyKey":"b","kin`); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()

	l = openLedger(t, path)
	if got := l.Stats().Settlements; got != 1 {
		t.Fatalf("Settlements = %d, want 1 (the torn line dropped)", got)
	}
	// The next append must start on a clean line, or the file is corrupt for the next reopen.
	mustAppend(t, l, settlement("c", thirdparty.KindCapture))
	_ = l.Close()
	if got := openLedger(t, path).Stats().Settlements; got != 2 {
		t.Fatalf("Settlements after reopen = %d, want 2", got)
	}
}

func TestLedgerRefusesCorruptLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	if err := os.WriteFile(path, []byte("not json\n{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := thirdparty.OpenLedger(path); err == nil {
		t.Fatal("OpenLedger succeeded on a corrupt ledger; an audit would silently miss data")
	}
}

func TestLedgerAppendAfterClose(t *testing.T) {
	l, err := thirdparty.OpenLedger(filepath.Join(t.TempDir(), "ledger.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(settlement("a", thirdparty.KindCapture)); !errors.Is(err, thirdparty.ErrLedgerClosed) {
		t.Fatalf("Append after Close = %v, want ErrLedgerClosed", err)
	}
}

func TestLedgerConcurrentAppends(t *testing.T) {
	const workers, perWorker, keys = 8, 25, 10
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := openLedger(t, path)

	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker)
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				key := fmt.Sprintf("k%d", (w*perWorker+i)%keys)
				if _, err := l.Append(settlement(key, thirdparty.KindCapture)); err != nil {
					errs <- err
				}
				_ = l.Stats() // readers run alongside writers in the server
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	want := thirdparty.Stats{
		Settlements: workers * perWorker, UniqueKeys: keys,
		Duplicates: workers*perWorker - keys, Captures: workers * perWorker,
	}
	if got := l.Stats(); got != want {
		t.Fatalf("Stats() = %+v, want %+v", got, want)
	}
	_ = l.Close()
	if got := openLedger(t, path).Stats(); got != want {
		t.Fatalf("Stats() after reopen = %+v, want %+v (lines interleaved on disk?)", got, want)
	}
}
