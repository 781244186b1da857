package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// DeadLetter is one dead outbox row or inbox dead letter, as listed.
type DeadLetter struct {
	Service string `json:"service"`
	// Kind is "outbox" (a row the relay gave up on, requeued by -ids) or
	// "inbox" (a message on the dead-letter topic, requeued by -event-ids).
	Kind          string    `json:"kind"`
	ID            int64     `json:"id,omitempty"`
	EventID       string    `json:"eventId,omitempty"`
	EventType     string    `json:"eventType,omitempty"`
	AggregateType string    `json:"aggregateType,omitempty"`
	AggregateID   string    `json:"aggregateId,omitempty"`
	Attempts      int       `json:"attempts,omitempty"`
	Reason        string    `json:"reason,omitempty"`
	Consumer      string    `json:"consumer,omitempty"`
	Error         string    `json:"lastError,omitempty"`
	Since         time.Time `json:"since"`
}

func (a *app) deadLettersList(ctx context.Context, args []string) error {
	fs := newFlags("dead-letters list", a.out)
	only := fs.String("service", "", "only this service (orders, billing, reconciler-shim); default all")
	limit := fs.Int("limit", 100, "at most this many per service and kind (1 to 10000)")
	topic := fs.String("topic", "", "the inbox topic whose dead letters to list (default: the service's input topic)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	services, err := a.selected(*only)
	if err != nil {
		return err
	}
	var all []DeadLetter
	for _, s := range services {
		if s.outbox {
			var res struct {
				Dead []struct {
					ID            int64     `json:"id"`
					EventID       string    `json:"eventId"`
					EventType     string    `json:"eventType"`
					AggregateType string    `json:"aggregateType"`
					AggregateID   string    `json:"aggregateId"`
					Attempts      int       `json:"attempts"`
					LastError     string    `json:"lastError"`
					CreatedAt     time.Time `json:"createdAt"`
				} `json:"dead"`
			}
			if err := a.call(ctx, "GET", s.admin+"/admin/outbox/dead?limit="+strconv.Itoa(*limit), nil, &res); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			for _, d := range res.Dead {
				all = append(all, DeadLetter{Service: s.name, Kind: "outbox", ID: d.ID, EventID: d.EventID, EventType: d.EventType,
					AggregateType: d.AggregateType, AggregateID: d.AggregateID, Attempts: d.Attempts, Error: d.LastError, Since: d.CreatedAt})
			}
		}
		if s.inboxTopic != "" {
			t := s.inboxTopic
			if *topic != "" {
				t = *topic
			}
			var res struct {
				DeadLetters []struct {
					EventID     string    `json:"eventId"`
					EventType   string    `json:"eventType"`
					AggregateID string    `json:"aggregateId"`
					Reason      string    `json:"reason"`
					Consumer    string    `json:"consumer"`
					FailedAt    time.Time `json:"failedAt"`
				} `json:"deadLetters"`
			}
			q := url.Values{"topic": {t}, "limit": {strconv.Itoa(*limit)}}
			if err := a.call(ctx, "GET", s.admin+"/admin/inbox/dead-letters?"+q.Encode(), nil, &res); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			for _, d := range res.DeadLetters {
				all = append(all, DeadLetter{Service: s.name, Kind: "inbox", EventID: d.EventID, EventType: d.EventType,
					AggregateID: d.AggregateID, Reason: d.Reason, Consumer: d.Consumer, Since: d.FailedAt})
			}
		}
	}
	if a.json {
		if all == nil {
			all = []DeadLetter{}
		}
		return a.writeJSON(all)
	}
	if len(all) == 0 {
		_, err := fmt.Fprintln(a.out, "no dead letters")
		return err
	}
	now := time.Now()
	rows := make([][]string, 0, len(all))
	for _, d := range all {
		id, why := d.EventID, d.Reason
		if d.Kind == "outbox" {
			id = strconv.FormatInt(d.ID, 10) + " " + d.EventID
			why = fmt.Sprintf("%d attempts: %s", d.Attempts, d.Error)
		}
		rows = append(rows, []string{d.Service, d.Kind, id, d.EventType, d.AggregateID, age(now, d.Since), short(why, 80)})
	}
	return a.table([]string{"SERVICE", "KIND", "ID", "EVENT TYPE", "AGGREGATE", "AGE", "WHY"}, rows)
}

func (a *app) deadLettersRequeue(ctx context.Context, args []string) error {
	fs := newFlags("dead-letters requeue", a.out)
	name := fs.String("service", "", "the service (orders, billing, reconciler-shim); required")
	kind := fs.String("kind", "", "outbox or inbox; needed only for billing, which has both")
	ids := fs.String("ids", "", "outbox: comma-separated row ids (from dead-letters list)")
	eventIDs := fs.String("event-ids", "", "comma-separated event ids (from dead-letters list, reconcile or journey): inbox dead letters, or dead outbox rows")
	all := fs.Bool("all", false, "requeue every dead row or pending dead letter of the service (bounded per call by the service; inbox: one whole pass, call after call)")
	topic := fs.String("topic", "", "inbox: the topic whose dead letters to requeue (default: the service's input topic)")
	consumer := fs.String("consumer", "", "inbox: only this consumer's dead letters")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s, err := a.service(*name)
	if err != nil {
		return err
	}
	switch {
	case *kind == "" && s.outbox && s.inboxTopic != "":
		return fmt.Errorf("%s has an outbox and an inbox: say -kind outbox or -kind inbox", s.name)
	case *kind == "" && s.outbox:
		*kind = "outbox"
	case *kind == "":
		*kind = "inbox"
	}
	// Exactly one selector: an empty one must never mean "everything".
	chosen := 0
	for _, set := range []bool{*ids != "", *eventIDs != "", *all} {
		if set {
			chosen++
		}
	}
	if chosen != 1 {
		return errors.New("say which: exactly one of -ids, -event-ids or -all")
	}
	var res struct {
		Requeued int `json:"requeued"`
	}
	switch *kind {
	case "outbox":
		if !s.outbox {
			return fmt.Errorf("%s has no outbox", s.name)
		}
		body := map[string]any{"all": true}
		switch {
		case *ids != "":
			list, err := parseInts(*ids)
			if err != nil {
				return err
			}
			body = map[string]any{"ids": list}
		case *eventIDs != "":
			// The reconciliation report and the journey name events by
			// their event id, the one id every tool shares; the service
			// requeues rows by row id, so look the dead ones up.
			list, err := a.deadOutboxRows(ctx, s, splitList(*eventIDs))
			if err != nil {
				return err
			}
			body = map[string]any{"ids": list}
		}
		err = a.call(ctx, "POST", s.admin+"/admin/outbox/requeue", body, &res)
	case "inbox":
		if s.inboxTopic == "" {
			return fmt.Errorf("%s has no inbox", s.name)
		}
		if *ids != "" {
			return errors.New("inbox dead letters are requeued by -event-ids, not -ids")
		}
		t := s.inboxTopic
		if *topic != "" {
			t = *topic
		}
		body := map[string]any{"topic": t}
		if *consumer != "" {
			body["consumer"] = *consumer
		}
		if *all {
			body["all"] = true
		} else {
			var list []uuid.UUID
			for _, f := range strings.Split(*eventIDs, ",") {
				id, err := uuid.Parse(strings.TrimSpace(f))
				if err != nil {
					return fmt.Errorf("-event-ids: %q is not a UUID", f)
				}
				list = append(list, id)
			}
			body["eventIds"] = list
		}
		// The service sends back at most 1000 per call and says where its
		// pass goes on; follow it to the end of the pass. Each pass ends:
		// it covers the letters present when it began.
		for {
			var page struct {
				Requeued int    `json:"requeued"`
				Next     string `json:"next"`
			}
			if err = a.call(ctx, "POST", s.admin+"/admin/inbox/dead-letters/requeue", body, &page); err != nil {
				if res.Requeued > 0 {
					err = fmt.Errorf("%w (requeued %d before this call)", err, res.Requeued)
				}
				break
			}
			res.Requeued += page.Requeued
			if page.Next == "" {
				break
			}
			body["after"] = page.Next
		}
	default:
		return fmt.Errorf("-kind must be outbox or inbox, got %q", *kind)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	if a.json {
		err = a.writeJSON(map[string]any{"service": s.name, "kind": *kind, "requeued": res.Requeued})
	} else {
		_, err = fmt.Fprintf(a.out, "%s: requeued %d %s dead letter(s)\n", s.name, res.Requeued, *kind)
	}
	if err != nil {
		return err
	}
	// Named ids that were not requeued are not dead letters (any more): say
	// so and fail, rather than print "requeued 0" and exit 0 as if done.
	asked := len(splitList(*ids)) + len(splitList(*eventIDs))
	if asked > 0 && res.Requeued < asked {
		return fmt.Errorf("%s: requeued %d of the %d named: the others are not %s dead letters of %s (requeue moves dead letters only; "+
			"onceflowctl journey <order id> shows what state each event is in, and an uncertain one is settled as docs/reconciliation.md#inbox_uncertain says)",
			s.name, res.Requeued, asked, *kind, s.name)
	}
	return nil
}

// deadOutboxRows returns the row ids of s's dead outbox rows with these
// event ids, failing with the ones that are not dead rows there (nothing is
// requeued then).
func (a *app) deadOutboxRows(ctx context.Context, s service, eventIDs []string) ([]int64, error) {
	var res struct {
		Dead []struct {
			ID      int64  `json:"id"`
			EventID string `json:"eventId"`
		} `json:"dead"`
	}
	// The service lists at most 10000 dead rows, oldest first; a requeue
	// takes at most 1000 ids anyway.
	if err := a.call(ctx, "GET", s.admin+"/admin/outbox/dead?limit=10000", nil, &res); err != nil {
		return nil, fmt.Errorf("%s: listing the dead outbox rows: %w", s.name, err)
	}
	rows := make(map[string]int64, len(res.Dead))
	for _, d := range res.Dead {
		rows[strings.ToLower(d.EventID)] = d.ID
	}
	var ids []int64
	var missing []string
	for _, e := range eventIDs {
		if _, err := uuid.Parse(e); err != nil {
			return nil, fmt.Errorf("-event-ids: %q is not a UUID", e)
		}
		if id, ok := rows[strings.ToLower(e)]; ok {
			ids = append(ids, id)
		} else {
			missing = append(missing, e)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s: not dead outbox rows of %s, nothing requeued: %s (onceflowctl journey <order id> shows what state an event is in)",
			s.name, s.name, strings.Join(missing, ", "))
	}
	return ids, nil
}

// splitList is the non-empty comma-separated fields of s.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-ids: %q is not a row id", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func short(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}
