package check

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// The kinds of Record. A history holds, in this order: one KindRun, then
// what happened while the faults ran (faults, operator actions, client
// calls) as it happened, then what was read back once the run was over.
const (
	// KindRun describes the run: Seed, Mode, Bound (the liveness bound in
	// seconds), Detail (the fault kinds chosen).
	KindRun = "run"
	// KindFault is one fault: Fault (its kind), Target, Detail, At and
	// Until (when it was cleared; zero for an instant fault such as a kill).
	KindFault = "fault"
	// KindOperator is an operator action (requeue, replay, reconcile):
	// Detail and Outcome.
	KindOperator = "operator"
	// KindPlace is a client's order placement: Key (its Idempotency-Key),
	// Order (the id, when the API answered) and Outcome.
	KindPlace = "place"
	// KindCancel is a client's cancellation of Order, with Outcome.
	KindCancel = "cancel"
	// KindOrder is a row of the orders database: Order, Status, and Key,
	// the Idempotency-Key that created it (which links a placement whose
	// answer never came to the order it made, if any).
	KindOrder = "order"
	// KindOutbox is an outbox row: Service (orders, billing), Event, Type,
	// Order, Version, Status (pending, published, dead).
	KindOutbox = "outbox"
	// KindMessage is a message read from a topic: Topic, Partition,
	// Offset, Event, Type, Order (the aggregate id), Version.
	KindMessage = "message"
	// KindDeadLetter is a message read from a dead-letter topic, as
	// KindMessage.
	KindDeadLetter = "dead_letter"
	// KindInbox is an inbox row: Service (billing, shim), Event, Type,
	// Order, Version, Status (processed, dead_lettered, uncertain, …, and
	// parked for a message held behind a dead one of its aggregate, which
	// has no inbox row).
	KindInbox = "inbox"
	// KindCharge is a row of billing's charges: Order, Status, Version.
	KindCharge = "charge"
	// KindBooking is one booking in the third party's ledger, in the order
	// it made them: Seq, Key (the idempotency key), Order, Type (capture,
	// refund), Detail (the ledger's id).
	KindBooking = "booking"
	// KindDrain is the liveness reading: At (when the faults stopped),
	// Seconds (how long until every consumer's lag was 0 and both outboxes
	// drained; -1 if never within the wait), Bound, Detail.
	KindDrain = "drain"
	// KindReconcile is the platform's reconciliation report (make
	// reconcile) taken after the end-of-run operator actions: At, Outcome
	// (Clean or Findings) and Detail (each kind it reports, with its count
	// and sample ids). Mid-run reports are operator faults, not this.
	KindReconcile = "reconcile"
)

// Outcomes of the end-of-run reconciliation report.
const (
	Clean    = "clean"    // it found nothing
	Findings = "findings" // it found inconsistencies, listed in Detail
)

// Outcomes of a client's call.
const (
	OK      = "ok"      // the API acknowledged it
	Refused = "refused" // the API answered 4xx: it did not happen
	Unknown = "unknown" // no answer (timeout, connection lost): it may have happened
)

// Record is one line of a history. Which fields are set depends on Kind.
type Record struct {
	Kind      string    `json:"kind"`
	At        time.Time `json:"at,omitzero"`
	Until     time.Time `json:"until,omitzero"`
	Seed      int64     `json:"seed,omitempty"`
	Mode      string    `json:"mode,omitempty"`
	Bound     float64   `json:"bound,omitempty"`
	Fault     string    `json:"fault,omitempty"`
	Target    string    `json:"target,omitempty"`
	Detail    string    `json:"detail,omitempty"`
	Outcome   string    `json:"outcome,omitempty"`
	Key       string    `json:"key,omitempty"`
	Order     string    `json:"order,omitempty"`
	Service   string    `json:"service,omitempty"`
	Status    string    `json:"status,omitempty"`
	Event     string    `json:"event,omitempty"`
	Type      string    `json:"type,omitempty"`
	Version   int64     `json:"version,omitempty"`
	Topic     string    `json:"topic,omitempty"`
	Partition int       `json:"partition,omitempty"`
	Offset    int64     `json:"offset,omitempty"`
	Seq       int       `json:"seq,omitempty"`
	Seconds   float64   `json:"seconds,omitempty"`
}

// Read parses a history written as JSON lines.
func Read(r io.Reader) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var rec Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("history line %d: %w", n, err)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

// ReadFile reads a history file.
func ReadFile(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f)
}

// Writer appends records to a history, one JSON line each. It is not safe
// for concurrent use; the nemesis serializes its writes.
type Writer struct {
	w   *bufio.Writer
	enc *json.Encoder
}

// NewWriter writes to w; call Flush at the end.
func NewWriter(w io.Writer) *Writer {
	bw := bufio.NewWriter(w)
	return &Writer{w: bw, enc: json.NewEncoder(bw)}
}

// Write appends rec.
func (w *Writer) Write(rec Record) error { return w.enc.Encode(rec) }

// Flush writes what is buffered.
func (w *Writer) Flush() error { return w.w.Flush() }
