// Package inboxhttp puts the inbox's dead-letter operations behind HTTP, with
// the standard library only, so any consuming service can mount them:
//
//	GET  /dead-letters?topic=NAME&limit=N   the dead letters (ListDeadLetters), oldest first
//	POST /dead-letters/requeue              {"topic":NAME,"eventIds":[…]} or {"topic":NAME,"all":true},
//	                                        either optionally with "consumer", "limit" and "after";
//	                                        answers {"requeued":N,"next":CURSOR}, with
//	                                        "refused":[{eventId, reason}] for letters it would not
//	                                        send (stored truncated with no original kept, or not
//	                                        decodable: a requeue sends an event whole or not at all)
//	GET  /parked?consumer=C&aggregateId=A&limit=N
//	                                        the events parked behind a dead event of their
//	                                        aggregate (inboxadmin.ListParked), each aggregate's in
//	                                        the order they will be released; all filters optional
//	POST /parked/release                    {"consumer":C,"aggregateType":T,"aggregateId":A,
//	                                        "reason":WHY,"operator":WHO}: inboxadmin.ReleaseHeld, the
//	                                        parked events are applied without the dead one
//	POST /parked/skip                       the same body: inboxadmin.SkipHeld, the dead and parked
//	                                        events are recorded skipped, never applied
//
// A parked event leaves the parking by itself once the dead event of its
// aggregate is requeued (POST /dead-letters/requeue) and applied. When that
// cannot happen (the dead letter left the topic through its retention, it
// cannot be sent whole, or the event is wrong for good), release or skip
// the aggregate, with a reason: both answer {"dead":[event ids],"parked":N},
// 404 not_found when the aggregate is not held (another operator acted, or
// the requeue got there first), and are recorded with the reason in
// inbox_operator_actions and logged.
//
// NAME is one of the names the service gave its dead-letter topics, never a
// topic itself, so the endpoints cannot be pointed at arbitrary topics.
// Requeuing every dead letter needs "all": true: an empty request or an
// empty id list is refused; named event ids none of which is in the topic
// are answered 404 not_found with nothing requeued, as the outbox's requeue
// answers unknown ids (when one call reads the whole pass, which it does up
// to the scan limit; a longer pass answers per call, "requeued" counting);
// at most MaxRequeueIDs ids per call. Every call sends back at most "limit" dead letters (1 to inboxadmin.MaxRequeueLimit,
// default inboxadmin.MaxRequeueLimit); to requeue more, call again with "after"
// set to the "next" of the previous answer until "next" is empty. A sweep
// ("all", or "consumer" alone) sends back only the letters still pending, so
// a second sweep finds nothing left (see inboxadmin.RequeueFilter). Mount it
// under a prefix with http.StripPrefix on the operator listener
// (httpserver.NewAdmin), which checks the bearer token: requeuing changes
// what consumers receive. Every requeue is logged with what it sent back.
package inboxhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/strictjson"
)

// MaxRequeueIDs is the most event ids one requeue call takes.
const MaxRequeueIDs = 1000

// RequeueRequest is the body of POST /dead-letters/requeue.
type RequeueRequest struct {
	// Topic is the dead-letter topic's name (a key of the handler's map).
	Topic string `json:"topic"`
	// Consumer narrows the requeue to one consumer's dead letters.
	Consumer string `json:"consumer"`
	// EventIDs selects the dead letters of these events (1 to MaxRequeueIDs).
	EventIDs []uuid.UUID `json:"eventIds"`
	// All selects every pending dead letter of the topic (of Consumer, if
	// set).
	All bool `json:"all"`
	// Limit is the most dead letters this call sends back: 1 to
	// inboxadmin.MaxRequeueLimit; absent or 0 means inboxadmin.MaxRequeueLimit.
	Limit int `json:"limit"`
	// After is the "next" of the previous call's answer, to go on with its
	// pass; absent starts a pass.
	After string `json:"after"`
}

// filter is the library's view of the request.
func (req RequeueRequest) filter() inboxadmin.RequeueFilter {
	return inboxadmin.RequeueFilter{Consumer: req.Consumer, EventIDs: req.EventIDs, All: req.All, Limit: req.Limit, After: req.After}
}

// DecodeRequeue decodes and checks a POST /dead-letters/requeue body. Errors
// are apperr.Malformed (400); which topics exist is the handler's business.
func DecodeRequeue(body []byte) (RequeueRequest, error) {
	var req RequeueRequest
	if err := strictjson.Unmarshal(body, &req); err != nil {
		return req, err
	}
	switch {
	case req.EventIDs != nil && len(req.EventIDs) == 0:
		return req, apperr.Errorf(apperr.Malformed, `"eventIds" is empty: list the event ids to requeue, or send "all": true`)
	case len(req.EventIDs) > MaxRequeueIDs:
		return req, apperr.Errorf(apperr.Malformed, "at most %d event ids per call", MaxRequeueIDs)
	}
	// {} and a negative limit are refused here, never taken for "everything".
	if err := req.filter().Validate(); err != nil {
		return req, apperr.Errorf(apperr.Malformed, "%s", strings.TrimPrefix(err.Error(), inboxadmin.ErrInvalidFilter.Error()+": "))
	}
	return req, nil
}

// Handler serves the dead-letter endpoints. db holds the inbox, w produces
// requeued messages (it must not have a Topic of its own; see
// inboxadmin.RequeueDeadLetters), brokers is the Kafka cluster, and dltTopics maps
// the names callers use to the dead-letter topics, e.g.
// {"orders": "orders.events.dlt"}. logger records every requeue and every
// internal error. opts reach every read of the dead-letter topics: pass
// inboxadmin.WithDialer(security.Dialer()) when the cluster wants TLS or SASL.
func Handler(db inboxadmin.RequeueDB, w inboxadmin.Writer, brokers []string, dltTopics map[string]string, logger *slog.Logger, opts ...inboxadmin.Option) http.Handler {
	topics := maps.Clone(dltTopics)
	names := slices.Sorted(maps.Keys(topics))
	writeError := func(rw http.ResponseWriter, r *http.Request, status int, msg string) {
		code := apperr.Invalid
		switch status {
		case http.StatusBadRequest:
			code = apperr.Malformed
		case http.StatusNotFound:
			code = apperr.NotFound
		}
		apperr.WriteHTTP(rw, r, logger, apperr.Errorf(code, "%s", msg))
	}
	// lookup reports an unknown or missing name itself and returns ok=false.
	lookup := func(rw http.ResponseWriter, r *http.Request, name string, missingStatus int) (string, bool) {
		if name == "" {
			writeError(rw, r, missingStatus, fmt.Sprintf("topic is required, one of: %s", strings.Join(names, ", ")))
			return "", false
		}
		topic, ok := topics[name]
		if !ok {
			writeError(rw, r, http.StatusNotFound, fmt.Sprintf("no dead-letter topic is named %s; known: %s", apperr.Quote(name), strings.Join(names, ", ")))
			return "", false
		}
		return topic, true
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /dead-letters", func(rw http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		limit := 100
		if s := q.Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 10_000 {
				writeError(rw, r, http.StatusBadRequest, "limit must be an integer from 1 to 10000")
				return
			}
			limit = n
		}
		name := q.Get("topic")
		topic, ok := lookup(rw, r, name, http.StatusBadRequest)
		if !ok {
			return
		}
		dls, err := inboxadmin.ListDeadLetters(r.Context(), brokers, topic, limit, opts...)
		if err != nil {
			apperr.WriteHTTP(rw, r, logger, err)
			return
		}
		out := make([]deadLetter, len(dls))
		for i, d := range dls {
			out[i] = deadLetter{
				Partition: d.Partition, Offset: d.Offset, Time: d.Time,
				Reason: d.Reason, Consumer: d.Consumer,
				OriginalTopic: d.OriginalTopic, OriginalPartition: d.OriginalPartition, OriginalOffset: d.OriginalOffset,
				FailedAt: d.FailedAt, EventType: d.EventType, AggregateID: d.AggregateID,
				KeySize: d.KeySize, ValueSize: d.ValueSize,
			}
			if d.EventID != uuid.Nil {
				out[i].EventID = d.EventID.String()
			}
		}
		apperr.WriteJSON(rw, http.StatusOK, map[string]any{
			"topic": name, "deadLetterTopic": topic, "count": len(out), "deadLetters": out,
		})
	})
	mux.HandleFunc("POST /dead-letters/requeue", func(rw http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, 1<<20))
		if err != nil {
			var mbe *http.MaxBytesError
			if !errors.As(err, &mbe) {
				err = apperr.Errorf(apperr.Malformed, "reading the request body failed")
			}
			apperr.WriteHTTP(rw, r, logger, err)
			return
		}
		req, err := DecodeRequeue(body)
		if err != nil {
			apperr.WriteHTTP(rw, r, logger, err)
			return
		}
		topic, ok := lookup(rw, r, req.Topic, http.StatusUnprocessableEntity)
		if !ok {
			return
		}
		res, err := inboxadmin.RequeueDeadLetters(r.Context(), db, w, brokers, topic, req.filter(), opts...)
		switch {
		case errors.Is(err, inboxadmin.ErrInvalidFilter):
			writeError(rw, r, http.StatusUnprocessableEntity, err.Error())
			return
		case err != nil:
			// Some may have been requeued before the failure; a retry is
			// safe, since the inbox absorbs what arrives twice. The count
			// goes to the log with the error, under the request id.
			apperr.WriteHTTP(rw, r, logger, fmt.Errorf("%w (requeued before the failure: %d)", err, res.Requeued))
			return
		}
		if len(req.EventIDs) > 0 && req.After == "" && res.Next == "" && res.Requeued == 0 && len(res.Refused) == 0 {
			// A whole pass in one call found none of the named events: the
			// outbox requeue's answer to unknown ids (404, nothing
			// requeued), so that a client tells "no such dead letter" from
			// "done" the same way for both libraries.
			writeError(rw, r, http.StatusNotFound, fmt.Sprintf("no dead letter of %s has event id %s; nothing was requeued",
				apperr.Quote(req.Topic), listEventIDs(req.EventIDs)))
			return
		}
		logger.InfoContext(r.Context(), "dead letters requeued by an operator",
			slog.Int("requeued", res.Requeued), slog.String("dead_letter_topic", topic), slog.String("consumer", req.Consumer),
			slog.Int("event_ids", len(req.EventIDs)), slog.Any("event_id_list", req.EventIDs), slog.Bool("all", req.All),
			slog.Int("limit", req.Limit), slog.String("after", req.After), slog.String("next", res.Next),
			slog.String("remote_addr", r.RemoteAddr), slog.String("request_id", apperr.RequestID(rw, r)))
		out := requeueResponse{Requeued: res.Requeued, Next: res.Next}
		for _, rf := range res.Refused {
			out.Refused = append(out.Refused, refusedLetter{EventID: rf.EventID.String(), Partition: rf.Partition, Offset: rf.Offset, Reason: rf.Reason})
			logger.WarnContext(r.Context(), "a dead letter was not requeued: it cannot be sent whole",
				slog.String("dead_letter_topic", topic), slog.String("event_id", rf.EventID.String()), slog.String("reason", rf.Reason),
				slog.String("request_id", apperr.RequestID(rw, r)))
		}
		apperr.WriteJSON(rw, http.StatusOK, out)
	})
	mux.HandleFunc("GET /parked", func(rw http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		f := inboxadmin.ParkedFilter{Consumer: q.Get("consumer"), AggregateID: q.Get("aggregateId")}
		if s := q.Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 1000 {
				writeError(rw, r, http.StatusBadRequest, "limit must be an integer from 1 to 1000")
				return
			}
			f.Limit = n
		}
		// A read in a transaction of its own: db is only known to Begin.
		tx, err := db.Begin(r.Context())
		if err != nil {
			apperr.WriteHTTP(rw, r, logger, err)
			return
		}
		defer tx.Rollback(context.WithoutCancel(r.Context())) //nolint:errcheck // read-only
		ps, err := inboxadmin.ListParked(r.Context(), tx, f)
		if err != nil {
			apperr.WriteHTTP(rw, r, logger, err)
			return
		}
		out := make([]parked, len(ps))
		for i, p := range ps {
			out[i] = parked{Consumer: p.Consumer, EventID: p.EventID.String(), EventType: p.EventType,
				AggregateType: p.AggregateType, AggregateID: p.AggregateID, AggregateVersion: p.AggregateVersion,
				Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, ParkedAt: p.ParkedAt}
			if p.BlockedBy != uuid.Nil {
				out[i].BlockedBy = p.BlockedBy.String()
			}
		}
		apperr.WriteJSON(rw, http.StatusOK, map[string]any{"count": len(out), "parked": out})
	})
	for _, action := range []string{inboxadmin.ActionRelease, inboxadmin.ActionSkip} {
		mux.HandleFunc("POST /parked/"+action, func(rw http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, 64<<10))
			if err != nil {
				apperr.WriteHTTP(rw, r, logger, apperr.Errorf(apperr.Malformed, "reading the request body failed"))
				return
			}
			var req HeldRequest
			if err := strictjson.Unmarshal(body, &req); err != nil {
				apperr.WriteHTTP(rw, r, logger, err)
				return
			}
			a := inboxadmin.HeldAction{Consumer: req.Consumer, AggregateType: req.AggregateType, AggregateID: req.AggregateID,
				Reason: req.Reason, Operator: req.Operator}
			if err := a.Validate(); err != nil {
				writeError(rw, r, http.StatusBadRequest, strings.TrimPrefix(err.Error(), inboxadmin.ErrInvalidHeldAction.Error()+": "))
				return
			}
			act := inboxadmin.ReleaseHeld
			if action == inboxadmin.ActionSkip {
				act = inboxadmin.SkipHeld
			}
			res, err := act(r.Context(), db, a)
			switch {
			case errors.Is(err, inboxadmin.ErrNotHeld):
				writeError(rw, r, http.StatusNotFound, fmt.Sprintf("%s %s of consumer %s is not held; nothing was changed",
					apperr.Quote(req.AggregateType), apperr.Quote(req.AggregateID), apperr.Quote(req.Consumer)))
				return
			case err != nil:
				apperr.WriteHTTP(rw, r, logger, err)
				return
			}
			logger.WarnContext(r.Context(), "a held aggregate was "+action+"d by an operator",
				slog.String("consumer", a.Consumer), slog.String("aggregate_type", a.AggregateType), slog.String("aggregate_id", a.AggregateID),
				slog.String("reason", a.Reason), slog.String("operator", a.Operator), slog.Any("dead", res.Dead), slog.Int("parked", res.Parked),
				slog.String("remote_addr", r.RemoteAddr), slog.String("request_id", apperr.RequestID(rw, r)))
			dead := make([]string, len(res.Dead))
			for i, id := range res.Dead {
				dead[i] = id.String()
			}
			apperr.WriteJSON(rw, http.StatusOK, map[string]any{"action": action, "dead": dead, "parked": res.Parked})
		})
	}
	return mux
}

// HeldRequest is the body of POST /parked/release and /parked/skip.
type HeldRequest struct {
	Consumer      string `json:"consumer"`
	AggregateType string `json:"aggregateType"`
	AggregateID   string `json:"aggregateId"`
	// Reason is required: it is recorded with the action.
	Reason   string `json:"reason"`
	Operator string `json:"operator"`
}

// refusedLetter is a dead letter a requeue would not send, and why.
type refusedLetter struct {
	EventID   string `json:"eventId"`
	Partition int    `json:"partition"`
	Offset    int64  `json:"offset"`
	Reason    string `json:"reason"`
}

type parked struct {
	Consumer         string    `json:"consumer"`
	EventID          string    `json:"eventId"`
	EventType        string    `json:"eventType"`
	AggregateType    string    `json:"aggregateType"`
	AggregateID      string    `json:"aggregateId"`
	AggregateVersion int64     `json:"aggregateVersion"`
	BlockedBy        string    `json:"blockedBy,omitempty"`
	Topic            string    `json:"topic"`
	Partition        int       `json:"partition"`
	Offset           int64     `json:"offset"`
	ParkedAt         time.Time `json:"parkedAt"`
}

// listEventIDs spells ids for an error message, the first ten of them.
func listEventIDs(ids []uuid.UUID) string {
	const most = 10
	s := make([]string, 0, most+1)
	for _, id := range ids[:min(len(ids), most)] {
		s = append(s, id.String())
	}
	if len(ids) > most {
		s = append(s, fmt.Sprintf("and %d more", len(ids)-most))
	}
	return strings.Join(s, ", ")
}

// requeueResponse is the answer of POST /dead-letters/requeue; Next is
// always present, empty once the pass is done.
type requeueResponse struct {
	Requeued int             `json:"requeued"`
	Next     string          `json:"next"`
	Refused  []refusedLetter `json:"refused,omitempty"`
}

type deadLetter struct {
	Partition         int       `json:"partition"`
	Offset            int64     `json:"offset"`
	Time              time.Time `json:"time"`
	Reason            string    `json:"reason"`
	Consumer          string    `json:"consumer"`
	OriginalTopic     string    `json:"originalTopic"`
	OriginalPartition int       `json:"originalPartition"`
	OriginalOffset    int64     `json:"originalOffset"`
	FailedAt          time.Time `json:"failedAt"`
	EventID           string    `json:"eventId,omitempty"`
	EventType         string    `json:"eventType,omitempty"`
	AggregateID       string    `json:"aggregateId,omitempty"`
	KeySize           int       `json:"keySize"`
	ValueSize         int       `json:"valueSize"`
}
