package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"
)

// ParkedEvent is one inbox event parked behind a dead event of its
// aggregate, as listed.
type ParkedEvent struct {
	Service          string    `json:"service"`
	Consumer         string    `json:"consumer"`
	EventID          string    `json:"eventId"`
	EventType        string    `json:"eventType"`
	AggregateType    string    `json:"aggregateType"`
	AggregateID      string    `json:"aggregateId"`
	AggregateVersion int64     `json:"aggregateVersion"`
	BlockedBy        string    `json:"blockedBy,omitempty"`
	ParkedAt         time.Time `json:"parkedAt"`
}

// parked lists the services' parked inbox events. They go by themselves
// once the dead event they wait for is requeued (dead-letters requeue
// -event-ids BLOCKED-BY) and applied.
func (a *app) parked(ctx context.Context, args []string) error {
	fs := newFlags("parked", a.out)
	only := fs.String("service", "", "only this service (billing, reconciler-shim); default all with an inbox")
	consumer := fs.String("consumer", "", "only this consumer's parked events")
	aggregate := fs.String("aggregate", "", "only this aggregate id's parked events")
	limit := fs.Int("limit", 100, "at most this many per service (1 to 1000)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	services, err := a.selected(*only)
	if err != nil {
		return err
	}
	all := []ParkedEvent{}
	for _, s := range services {
		if s.inboxTopic == "" {
			continue
		}
		q := url.Values{"limit": {strconv.Itoa(*limit)}}
		if *consumer != "" {
			q.Set("consumer", *consumer)
		}
		if *aggregate != "" {
			q.Set("aggregateId", *aggregate)
		}
		var res struct {
			Parked []ParkedEvent `json:"parked"`
		}
		if err := a.call(ctx, "GET", s.admin+"/admin/inbox/parked?"+q.Encode(), nil, &res); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		for _, p := range res.Parked {
			p.Service = s.name
			all = append(all, p)
		}
	}
	if a.json {
		return a.writeJSON(all)
	}
	if len(all) == 0 {
		_, err := fmt.Fprintln(a.out, "no parked events")
		return err
	}
	now := time.Now()
	rows := make([][]string, 0, len(all))
	for _, p := range all {
		rows = append(rows, []string{p.Service, p.Consumer, p.EventID, p.EventType,
			p.AggregateID + " v" + strconv.FormatInt(p.AggregateVersion, 10), age(now, p.ParkedAt), p.BlockedBy})
	}
	return a.table([]string{"SERVICE", "CONSUMER", "EVENT ID", "EVENT TYPE", "AGGREGATE", "AGE", "WAITS FOR"}, rows)
}

// parkedAct releases or skips a held aggregate (POST /admin/inbox/parked/
// release or /skip): the way out when its dead event cannot be requeued
// (the dead letter left the topic through its retention, it cannot be sent
// whole, or the event is wrong for good). The service records the action
// with its reason; a second one finds nothing held and fails.
func (a *app) parkedAct(ctx context.Context, action string, args []string) error {
	fs := newFlags("parked "+action, a.out)
	only := fs.String("service", "", "the service whose inbox holds the aggregate (billing, reconciler-shim)")
	consumer := fs.String("consumer", "", "the consumer (inbox name) that holds it, as parked lists it")
	aggregateType := fs.String("aggregate-type", "", "the aggregate's type, as parked lists it")
	aggregate := fs.String("aggregate", "", "the aggregate's id")
	reason := fs.String("reason", "", "why (recorded with the action); required")
	operator := fs.String("operator", a.getenv("USER"), "who acts, for the record")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *only == "" || *consumer == "" || *aggregateType == "" || *aggregate == "" || *reason == "" {
		return errors.New("parked " + action + " needs -service, -consumer, -aggregate-type, -aggregate and -reason")
	}
	s, err := a.service(*only)
	if err != nil {
		return err
	}
	if s.inboxTopic == "" {
		return fmt.Errorf("%s has no inbox", s.name)
	}
	body := map[string]string{"consumer": *consumer, "aggregateType": *aggregateType, "aggregateId": *aggregate,
		"reason": *reason, "operator": *operator}
	var res struct {
		Dead   []string `json:"dead"`
		Parked int      `json:"parked"`
	}
	if err := a.call(ctx, "POST", s.admin+"/admin/inbox/parked/"+action, body, &res); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	if a.json {
		return a.writeJSON(map[string]any{"service": s.name, "action": action, "dead": res.Dead, "parked": res.Parked})
	}
	what := "released: the parked events are applied in order, without the dead one (which stays dead and listed)"
	if action == "skip" {
		what = "skipped: the dead and parked events are recorded skipped and never applied"
	}
	_, err = fmt.Fprintf(a.out, "%s: %s %s of %s %s; %d dead event(s) %v, %d parked\n", s.name, action, *aggregateType,
		*aggregate, what, len(res.Dead), res.Dead, res.Parked)
	return err
}
