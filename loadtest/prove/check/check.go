package check

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// The kinds of Finding.
const (
	// Atomicity: what the client was told and what the database holds
	// disagree (an acknowledged order absent, a refused one present, a
	// cancellation acknowledged and not done), or an event or a charge
	// exists for an order that does not.
	Atomicity = "atomicity"
	// Loss: a committed order's effect is missing downstream, with no
	// dead or uncertain trace that would explain it.
	Loss = "loss"
	// Unresolved: an effect is missing and the history shows why (a dead
	// outbox row, a dead letter, an uncertain forward) — but the operator
	// action the nemesis took at the end did not resolve it.
	Unresolved = "unresolved"
	// Duplicate: an effect happened twice (two captures or refunds of one
	// order in billing or at the third party, one idempotency key booked
	// twice).
	Duplicate = "duplicate"
	// Order: an aggregate's events were published, applied or booked out
	// of their order (a refund before its capture, v2 before v1 on a topic,
	// a cancellation applied before the order it cancels).
	Order = "order"
	// Liveness: after the faults stopped, the lag and the backlogs did not
	// drain within the run's bound.
	Liveness = "liveness"
)

// Kinds lists the finding kinds in the order the table prints them.
var Kinds = []string{Atomicity, Loss, Unresolved, Duplicate, Order, Liveness}

// Finding is one broken invariant, with the story of the order it is about.
type Finding struct {
	Kind  string `json:"kind"`
	Order string `json:"order,omitempty"`
	What  string `json:"what"`
	// Story is every record of the history about the order, in the order
	// they were written: what the client saw, then what each component
	// holds.
	Story []Record `json:"story,omitempty"`
}

// Result is a checked history.
type Result struct {
	Seed  int64
	Mode  string
	Bound float64
	// Faults counts the faults applied by kind; Operator the operator
	// actions.
	Faults   map[string]int
	Operator int
	// Orders is how many orders were committed; Placed how many placements
	// were tried, by outcome.
	Orders   int
	Placed   map[string]int
	Findings []Finding
	// TakenBack counts the orders whose losses an asynchronous Postgres
	// failover explains (failover.go): allowed, and shown.
	TakenBack int
}

// ByKind counts the findings of each kind.
func (r Result) ByKind() map[string]int {
	out := map[string]int{}
	for _, f := range r.Findings {
		out[f.Kind]++
	}
	return out
}

// OK reports whether the history broke no invariant.
func (r Result) OK() bool { return len(r.Findings) == 0 }

// The event types the checker reads, as the services' contracts name them.
const (
	orderPlaced     = "OrderPlaced"
	orderCancelled  = "OrderCancelled"
	paymentCaptured = "PaymentCaptured"
	paymentRefunded = "PaymentRefunded"
	bookCapture     = "capture"
	bookRefund      = "refund"
)

// states that say "this did not happen, visibly": a dead outbox row, a dead
// letter, an uncertain forward, a message parked behind a dead one, or one
// an operator skipped with a reason (inbox_operator_actions). A requeued
// inbox row is not among them: it waits for its redelivery, and one still
// requeued at the end of a run is unresolved.
func visiblyStuck(status string) bool {
	return status == "dead" || status == "dead_lettered" || status == "uncertain" || status == "parked" || status == "skipped"
}

// orderView gathers one order's records.
type orderView struct {
	id       string
	records  []Record
	placed   []string // outcomes of the placements that named this id
	cancels  []string
	row      *Record
	charge   *Record
	messages map[string][]Record // by topic role: "orders", "billing"
	stuck    []Record
	bookings []Record
}

// Check tests the invariants over a history.
func Check(history []Record) Result {
	res := Result{Faults: map[string]int{}, Placed: map[string]int{}}
	views := map[string]*orderView{}
	var ids []string
	view := func(id string) *orderView {
		v, ok := views[id]
		if !ok {
			v = &orderView{id: id, messages: map[string][]Record{}}
			views[id] = v
			ids = append(ids, id)
		}
		return v
	}
	var drains, reconciles, faults []Record
	// Which topic is which: the run names them by the service that writes
	// them (Service on a message record).
	keyBooked := map[string]int{}
	// A placement that got no answer names no order; the orders database's
	// idempotency keys say which order, if any, it created.
	byKey := map[string]string{}
	for _, rec := range history {
		if rec.Kind == KindOrder && rec.Key != "" {
			byKey[rec.Key] = rec.Order
		}
	}
	for _, rec := range history {
		if rec.Kind == KindPlace && rec.Order == "" {
			rec.Order = byKey[rec.Key]
		}
		switch rec.Kind {
		case KindRun:
			res.Seed, res.Mode, res.Bound = rec.Seed, rec.Mode, rec.Bound
			continue
		case KindFault:
			res.Faults[rec.Fault]++
			faults = append(faults, rec)
			continue
		case KindOperator:
			res.Operator++
			continue
		case KindDrain:
			drains = append(drains, rec)
			continue
		case KindReconcile:
			reconciles = append(reconciles, rec)
			continue
		case KindPlace:
			res.Placed[rec.Outcome]++
		}
		if rec.Order == "" {
			continue
		}
		v := view(rec.Order)
		v.records = append(v.records, rec)
		switch rec.Kind {
		case KindPlace:
			v.placed = append(v.placed, rec.Outcome)
		case KindCancel:
			v.cancels = append(v.cancels, rec.Outcome)
		case KindOrder:
			r := rec
			v.row = &r
		case KindCharge:
			r := rec
			v.charge = &r
		case KindMessage:
			v.messages[rec.Service] = append(v.messages[rec.Service], rec)
		case KindOutbox, KindInbox, KindDeadLetter:
			if rec.Kind == KindDeadLetter || visiblyStuck(rec.Status) {
				v.stuck = append(v.stuck, rec)
			}
		case KindBooking:
			v.bookings = append(v.bookings, rec)
			keyBooked[rec.Key]++
		}
	}
	windows := asyncWindows(faults, res.Mode)
	takenBackIDs := map[string]bool{}
	for _, id := range ids {
		v := views[id]
		if v.row != nil {
			res.Orders++
		}
		fs := v.check(keyBooked)
		if w, exposed := v.exposed(windows); len(fs) > 0 && exposed {
			var excused int
			if fs, excused = v.takenBack(fs, w); excused > 0 {
				res.TakenBack++
				takenBackIDs[id] = true
			}
		}
		for _, f := range fs {
			f.Order, f.Story = id, story(v.records, faults)
			res.Findings = append(res.Findings, f)
		}
	}
	for _, d := range drains {
		switch {
		case d.Seconds < 0:
			res.Findings = append(res.Findings, Finding{Kind: Liveness,
				What: fmt.Sprintf("after the faults stopped, the platform did not drain within the wait (%s)", d.Detail)})
		case d.Bound > 0 && d.Seconds > d.Bound:
			res.Findings = append(res.Findings, Finding{Kind: Liveness,
				What: fmt.Sprintf("after the faults stopped, draining took %.1fs, over the bound of %.0fs (%s)", d.Seconds, d.Bound, d.Detail)})
		}
	}
	// The platform's own reconciliation, after the end-of-run operator
	// actions, must find nothing either: what it reports is left for an
	// operator, so unresolved.
	for _, r := range reconciles {
		if r.Outcome == Findings && !reconciledTakenBack(r.Detail, takenBackIDs) {
			res.Findings = append(res.Findings, Finding{Kind: Unresolved,
				What: "the end-of-run reconciliation (make reconcile) still reports: " + r.Detail})
		}
	}
	return res
}

// check returns the findings about one order.
func (v *orderView) check(keyBooked map[string]int) []Finding {
	var out []Finding
	add := func(kind, format string, args ...any) {
		out = append(out, Finding{Kind: kind, What: fmt.Sprintf(format, args...)})
	}
	present := v.row != nil
	acked := slices.Contains(v.placed, OK)
	refused := len(v.placed) > 0 && !acked && !slices.Contains(v.placed, Unknown)
	ordersMsgs := distinctEvents(v.messages["orders"])
	billingMsgs := distinctEvents(v.messages["billing"])
	placedOnTopic := countType(ordersMsgs, orderPlaced)
	cancelledOnTopic := countType(ordersMsgs, orderCancelled)
	// Bookings by distinct idempotency key: two keys for one order is a
	// second payment (billing charged twice); one key booked twice is the
	// shim's duplicate, reported once below.
	captures, refunds := 0, 0
	keys := map[string]bool{}
	for _, b := range v.bookings {
		if keys[b.Key] {
			continue
		}
		keys[b.Key] = true
		switch b.Type {
		case bookCapture:
			captures++
		case bookRefund:
			refunds++
		}
	}

	// Atomicity: the client's view against the database.
	switch {
	case acked && !present:
		add(Atomicity, "the API acknowledged the order, and it is not in the orders database")
	case refused && present:
		add(Atomicity, "the API refused the order, and it is in the orders database")
	case !present && (placedOnTopic > 0 || v.charge != nil || len(v.bookings) > 0):
		add(Atomicity, "no such order in the orders database, yet it has effects (%d OrderPlaced on the topic, charge %v, %d bookings)",
			placedOnTopic, v.charge != nil, len(v.bookings))
	}
	cancelAcked := slices.Contains(v.cancels, OK)
	if present && cancelAcked && v.row.Status != "cancelled" {
		add(Atomicity, "the API acknowledged the cancellation, and the order's status is %q", v.row.Status)
	}
	if !present {
		return out
	}
	cancelled := v.row.Status == "cancelled"

	// No loss: every committed event reaches every consumer, or is
	// visibly stuck (then the end-of-run operator action should have
	// resolved it: unresolved).
	lossKind := Loss
	why := "no dead or uncertain trace explains it"
	if len(v.stuck) > 0 {
		lossKind = Unresolved
		why = "visibly stuck, and still so after the end-of-run operator action: " + describe(v.stuck)
	}
	switch {
	case placedOnTopic == 0 && v.charge == nil:
		rows := "no outbox row of it is left either"
		for _, r := range v.records {
			if r.Kind == KindOutbox && r.Service == "orders" && r.Type == orderPlaced {
				rows = "its outbox row is " + r.Status
			}
		}
		add(lossKind, "the committed order's OrderPlaced never reached the orders topic, and billing never charged it; %s (%s)", rows, why)
	case v.charge == nil:
		add(lossKind, "the OrderPlaced is on the orders topic, and billing never charged the order (%s)", why)
	case captures == 0 && countType(billingMsgs, paymentCaptured) == 0:
		rows := "no outbox row of it is left either"
		for _, r := range v.records {
			if r.Kind == KindOutbox && r.Service == "billing" && r.Type == paymentCaptured {
				rows = "its outbox row is " + r.Status
			}
		}
		add(lossKind, "billing charged the order, its PaymentCaptured never reached billing's topic, and the third party never booked it; %s (%s)", rows, why)
	case captures == 0:
		add(lossKind, "billing charged the order, and the third party never booked its capture (%s)", why)
	}
	if cancelled && cancelledOnTopic == 0 {
		add(lossKind, "the order is cancelled, and its OrderCancelled never reached the orders topic (%s)", why)
	}
	if v.charge != nil && v.charge.Status == "refunded" && refunds == 0 {
		add(lossKind, "billing refunded the charge, and the third party never booked the refund (%s)", why)
	}

	// No duplicate effect, ever (also while faults ran: the ledger keeps
	// every booking).
	if captures > 1 {
		add(Duplicate, "the third party booked %d captures of the order, under distinct payments", captures)
	}
	if refunds > 1 {
		add(Duplicate, "the third party booked %d refunds of the order, under distinct payments", refunds)
	}
	if n := countType(billingMsgs, paymentCaptured); n > 1 {
		add(Duplicate, "billing published %d distinct PaymentCaptured events for the order (charged %d times)", n, n)
	}
	if n := countType(billingMsgs, paymentRefunded); n > 1 {
		add(Duplicate, "billing published %d distinct PaymentRefunded events for the order", n)
	}
	seen := map[string]bool{}
	for _, b := range v.bookings {
		if keyBooked[b.Key] > 1 && !seen[b.Key] {
			seen[b.Key] = true
			add(Duplicate, "the third party booked the %s under idempotency key %s %d times", b.Type, b.Key, keyBooked[b.Key])
		}
	}

	// Per-key order: on the orders topic (one partition per key, so offsets
	// order it), at billing and at the third party.
	if first := firstOffsets(v.messages["orders"]); first[orderCancelled] >= 0 && first[orderPlaced] >= 0 &&
		first[orderCancelled] < first[orderPlaced] {
		add(Order, "the orders topic holds OrderCancelled (offset %d) before OrderPlaced (offset %d): the relay published v2 before v1",
			first[orderCancelled], first[orderPlaced])
	} else if first[orderCancelled] >= 0 && first[orderPlaced] < 0 && placedOnTopic == 0 {
		add(Order, "the orders topic holds OrderCancelled and no OrderPlaced")
	}
	// At billing: OrderCancelled dead-lettered before billing published
	// the order's PaymentCaptured, while OrderPlaced came first on the
	// topic, means billing handled v2 before v1 (a worker that abandoned
	// v1 and went on with the later messages of its key: issue 19 item 4).
	// The runbook's requeue may repair the order's end state, so only the
	// dead letter's time shows it.
	if first := firstOffsets(v.messages["orders"]); first[orderPlaced] >= 0 && first[orderCancelled] > first[orderPlaced] {
		captured := firstAt(v.messages["billing"], paymentCaptured)
		for _, d := range v.stuck {
			if d.Kind == KindDeadLetter && d.Service == "orders" && d.Type == orderCancelled && !d.At.IsZero() &&
				(captured.IsZero() || d.At.Before(captured)) {
				add(Order, "billing dead-lettered OrderCancelled (%s) before it published the order's PaymentCaptured, "+
					"though OrderPlaced came first on the topic (offset %d, then %d): billing handled v2 before v1",
					d.Detail, first[orderPlaced], first[orderCancelled])
				break
			}
		}
	}
	if first := firstOffsets(v.messages["billing"]); first[paymentRefunded] >= 0 &&
		(first[paymentCaptured] < 0 || first[paymentRefunded] < first[paymentCaptured]) {
		add(Order, "billing's topic holds PaymentRefunded (offset %d) before its PaymentCaptured (offset %d)",
			first[paymentRefunded], first[paymentCaptured])
	}
	firstCapture, firstRefund := -1, -1
	for _, b := range v.bookings {
		if b.Type == bookCapture && firstCapture < 0 {
			firstCapture = b.Seq
		}
		if b.Type == bookRefund && firstRefund < 0 {
			firstRefund = b.Seq
		}
	}
	switch {
	case firstRefund >= 0 && firstCapture < 0:
		add(Order, "the third party booked the refund (booking #%d) and never the capture", firstRefund)
	case firstRefund >= 0 && firstRefund < firstCapture:
		add(Order, "the third party booked the refund (booking #%d) before the capture (booking #%d)", firstRefund, firstCapture)
	}
	if cancelled && v.charge != nil && v.charge.Status != "refunded" {
		add(Order, "the order is cancelled and its charge stands (%q): billing handled OrderCancelled before OrderPlaced, or never", v.charge.Status)
	}
	return out
}

// storyWindow is how far around an order's timed records a fault counts as
// part of its story: a fault a little before the placement or after the
// last booking can still be what broke it (a paused worker holding it).
const storyWindow = 30 * time.Second

// story interleaves an order's timed records with the faults around them,
// by time, then adds what was read back once the run was over.
func story(recs, faults []Record) []Record {
	var timed, untimed []Record
	var first, last time.Time
	for _, r := range recs {
		if r.At.IsZero() {
			untimed = append(untimed, r)
			continue
		}
		timed = append(timed, r)
		if first.IsZero() || r.At.Before(first) {
			first = r.At
		}
		if r.At.After(last) {
			last = r.At
		}
	}
	if !first.IsZero() {
		for _, f := range faults {
			end := f.Until
			if end.IsZero() {
				end = f.At
			}
			if !end.Before(first.Add(-storyWindow)) && !f.At.After(last.Add(storyWindow)) {
				timed = append(timed, f)
			}
		}
	}
	sort.SliceStable(timed, func(i, j int) bool { return timed[i].At.Before(timed[j].At) })
	return append(timed, untimed...)
}

// distinctEvents keeps one message per event id (redeliveries and
// republished batches are normal and absorbed downstream).
func distinctEvents(msgs []Record) []Record {
	seen := map[string]bool{}
	var out []Record
	for _, m := range msgs {
		if !seen[m.Event] {
			seen[m.Event] = true
			out = append(out, m)
		}
	}
	return out
}

func countType(msgs []Record, typ string) int {
	n := 0
	for _, m := range msgs {
		if m.Type == typ {
			n++
		}
	}
	return n
}

// firstOffsets is, per event type, the lowest offset a message of it has on
// its topic (-1: none). One key lives on one partition, so offsets order
// the key's messages.
func firstOffsets(msgs []Record) map[string]int64 {
	out := map[string]int64{orderPlaced: -1, orderCancelled: -1, paymentCaptured: -1, paymentRefunded: -1}
	for _, m := range msgs {
		if cur, ok := out[m.Type]; !ok || cur < 0 || m.Offset < cur {
			out[m.Type] = m.Offset
		}
	}
	return out
}

// firstAt is when the first message of type typ was written (zero: none,
// or none with a time).
func firstAt(msgs []Record, typ string) time.Time {
	var first time.Time
	for _, m := range msgs {
		if m.Type == typ && !m.At.IsZero() && (first.IsZero() || m.At.Before(first)) {
			first = m.At
		}
	}
	return first
}

func describe(recs []Record) string {
	var parts []string
	for _, r := range recs {
		if r.Kind == KindDeadLetter {
			parts = append(parts, fmt.Sprintf("%s dead letter on %s", r.Type, r.Topic))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s %s %s", r.Service, r.Kind, r.Type, r.Status))
	}
	return strings.Join(parts, "; ")
}

// Table writes one row per result: seed, faults applied by kind, orders,
// findings by kind.
func Table(w io.Writer, results []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "mode\tseed\tfaults\torders\tplaced ok/refused/unknown\t%s\tresult\t\n", strings.Join(Kinds, "\t"))
	for _, r := range results {
		by := r.ByKind()
		counts := make([]string, len(Kinds))
		for i, k := range Kinds {
			counts[i] = fmt.Sprint(by[k])
		}
		status := "PASS"
		if !r.OK() {
			status = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d/%d/%d\t%s\t%s\t\n", r.Mode, r.Seed, faultSummary(r), r.Orders,
			r.Placed[OK], r.Placed[Refused], r.Placed[Unknown], strings.Join(counts, "\t"), status)
	}
	tw.Flush()
}

func faultSummary(r Result) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.Faults)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.Faults[k]))
	}
	if r.Operator > 0 {
		parts = append(parts, fmt.Sprintf("end-of-run requeues %d", r.Operator))
	}
	if r.TakenBack > 0 {
		parts = append(parts, fmt.Sprintf("orders taken back by an asynchronous failover %d", r.TakenBack))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// Stories writes each finding with its order's story, at most max of each
// kind (0: all), so that a run with hundreds of one finding stays
// readable; the history file has them all.
func Stories(w io.Writer, r Result, max int) {
	shown := map[string]int{}
	fs := slices.Clone(r.Findings)
	sort.SliceStable(fs, func(i, j int) bool { return slices.Index(Kinds, fs[i].Kind) < slices.Index(Kinds, fs[j].Kind) })
	for _, f := range fs {
		shown[f.Kind]++
		if max > 0 && shown[f.Kind] > max {
			continue
		}
		if f.Order == "" {
			fmt.Fprintf(w, "[%s] %s (seed %d, %s)\n", f.Kind, f.What, r.Seed, r.Mode)
			continue
		}
		fmt.Fprintf(w, "[%s] order %s: %s (seed %d, %s)\n", f.Kind, f.Order, f.What, r.Seed, r.Mode)
		for _, s := range f.Story {
			fmt.Fprintf(w, "    %s\n", storyLine(s))
		}
	}
	for _, k := range Kinds {
		if max > 0 && shown[k] > max {
			fmt.Fprintf(w, "[%s] … and %d more findings of this kind (all in the history)\n", k, shown[k]-max)
		}
	}
}

func storyLine(s Record) string {
	at := ""
	if !s.At.IsZero() {
		at = s.At.Format("15:04:05.000") + " "
	}
	switch s.Kind {
	case KindPlace:
		return fmt.Sprintf("%sclient: place (key %s) → %s", at, s.Key, s.Outcome)
	case KindCancel:
		return fmt.Sprintf("%sclient: cancel → %s", at, s.Outcome)
	case KindOrder:
		return fmt.Sprintf("orders db: order %s", s.Status)
	case KindOutbox:
		return fmt.Sprintf("%s outbox: %s v%d %s (event %s)", s.Service, s.Type, s.Version, s.Status, s.Event)
	case KindMessage:
		return fmt.Sprintf("%s%s topic: %s v%d at %d/%d (event %s)", at, s.Service, s.Type, s.Version, s.Partition, s.Offset, s.Event)
	case KindDeadLetter:
		return fmt.Sprintf("%sdead letter %s: %s v%d (event %s) %s", at, s.Topic, s.Type, s.Version, s.Event, s.Detail)
	case KindInbox:
		return fmt.Sprintf("%s inbox: %s v%d %s (event %s)", s.Service, s.Type, s.Version, s.Status, s.Event)
	case KindCharge:
		return fmt.Sprintf("billing db: charge %s v%d", s.Status, s.Version)
	case KindFault:
		until := ""
		if !s.Until.IsZero() {
			until = fmt.Sprintf(" (until %s)", s.Until.Format("15:04:05.000"))
		}
		return fmt.Sprintf("%snemesis: %s %s %s%s", at, s.Fault, s.Target, s.Detail, until)
	case KindBooking:
		return fmt.Sprintf("%sthird party: booking #%d %s (key %s, id %s)", at, s.Seq, s.Type, s.Key, s.Detail)
	}
	return fmt.Sprintf("%s%s %+v", at, s.Kind, s)
}
