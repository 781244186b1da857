// Package outboxhttp puts the outbox's operator functions behind HTTP, with
// the standard library and the platform's error mapping only, so any service
// can mount them:
//
//	GET  /dead?limit=N   the dead events (ListDead), oldest first
//	POST /requeue        {"ids":[…]}, or {"aggregateType":…,"aggregateId":…,"limit":N},
//	                     or {"all":true,"limit":N}: at most MaxRequeue rows per call
//	POST /replay         {"aggregateType":…,"aggregateId":…,"from":…,"to":…,"dryRun":false}:
//	                     from and to required; a dry run unless dryRun is false;
//	                     at most MaxReplay events per call
//
// The handler acts in the service's relay mode (outboxadmin's functions take it):
// every mode requeues and replays for real, or refuses with 409 — a
// requeue or replay is never answered with a success the relay will not
// carry out (RELAY_MODE=wal keeps no copy of its events, so its replay and
// a requeue that finds no dead row are refused).
//
// Errors are apperr bodies: 400 for a malformed request (a replay without
// from and to among them), 404 for a requeue naming ids that do not exist
// (outboxadmin.ErrNotFound; nothing is requeued), 409 for an action the
// relay mode cannot carry out (outboxadmin.ErrNotInThisMode), 422 for a
// replay filter outboxadmin.Replay refuses or a scope over MaxReplay events
// (the message states the cap), 503 while the database is unreachable
// (outbox.ErrUnavailable), 500 otherwise.
//
// Mount it under a prefix with http.StripPrefix, on the operator listener
// (httpserver.NewAdmin), which checks the bearer token: these endpoints
// change what a service publishes. Every call that changes something is
// logged with what it changed.
package outboxhttp

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/strictjson"
)

// MaxRequeue is the most rows one POST /requeue sets back to pending, and
// the most ids it takes: an operator clearing a large backlog calls again
// until "requeued" is 0, watching the relay keep up in between.
const MaxRequeue = 1000

// MaxReplay is the most events one POST /replay may cover, dry run or not;
// a larger scope is refused whole with a 422 that states it. An operator
// replaying more splits the window.
const MaxReplay = 10_000

// maxBody bounds an operator request body; the largest, a requeue of
// MaxRequeue ids, is far smaller.
const maxBody = 1 << 20

// RequeueRequest is the body of POST /requeue. Exactly one way of selecting
// must be used: Ids, a filter (AggregateType, optionally AggregateID), or
// All. An empty request, an empty id list or a negative limit is refused,
// never read as "everything".
type RequeueRequest struct {
	IDs           []int64 `json:"ids"`
	AggregateType string  `json:"aggregateType"`
	AggregateID   string  `json:"aggregateId"`
	// All selects every dead row (of AggregateType/AggregateID when set).
	All bool `json:"all"`
	// Limit is the most rows requeued, oldest first: 1 to MaxRequeue,
	// absent or 0 meaning MaxRequeue. Not allowed with IDs.
	Limit int `json:"limit"`
}

// ReplayRequest is the body of POST /replay. From and To are required: a
// replay always takes a window.
type ReplayRequest struct {
	AggregateType string    `json:"aggregateType"`
	AggregateID   string    `json:"aggregateId"`
	From          time.Time `json:"from"`
	To            time.Time `json:"to"`
	// DryRun only lists what would be replayed. Absent means true: a replay
	// republishes events to every consumer, so it happens only when asked
	// for with "dryRun": false.
	DryRun *bool `json:"dryRun"`
}

// DecodeRequeue decodes and checks a POST /requeue body. Errors are
// apperr.Malformed (400).
func DecodeRequeue(body []byte) (RequeueRequest, error) {
	var req RequeueRequest
	if err := strictjson.Unmarshal(body, &req); err != nil {
		return req, err
	}
	bad := func(msg string) (RequeueRequest, error) { return req, apperr.Errorf(apperr.Malformed, "%s", msg) }
	filter := req.AggregateType != "" || req.AggregateID != ""
	switch {
	case req.IDs != nil && len(req.IDs) == 0:
		return bad(`"ids" is empty: list the ids to requeue, or send {"all":true} to requeue every dead row`)
	case len(req.IDs) > MaxRequeue:
		return bad("at most " + strconv.Itoa(MaxRequeue) + " ids per call")
	case len(req.IDs) > 0 && (filter || req.All || req.Limit != 0):
		return bad(`"ids" cannot be combined with "aggregateType", "aggregateId", "all" or "limit"`)
	case req.Limit < 0 || req.Limit > MaxRequeue:
		return bad(`"limit" must be from 1 to ` + strconv.Itoa(MaxRequeue) + " (absent: " + strconv.Itoa(MaxRequeue) + ")")
	case req.AggregateID != "" && req.AggregateType == "":
		return bad(`"aggregateId" needs "aggregateType"`)
	case len(req.IDs) == 0 && !filter && !req.All:
		return bad(`say what to requeue: {"ids":[…]}, {"aggregateType":…}, or {"all":true} for every dead row`)
	}
	for _, s := range []string{req.AggregateType, req.AggregateID} {
		if err := apperr.CheckText("the aggregate", s); err != nil {
			return req, err
		}
	}
	return req, nil
}

// DecodeReplay decodes a POST /replay body. Errors are apperr.Malformed
// (400): an undecodable body, or one without "from" and "to"; the filter's
// own rules are outboxadmin.Replay's (422).
func DecodeReplay(body []byte) (ReplayRequest, error) {
	var req ReplayRequest
	if err := strictjson.Unmarshal(body, &req); err != nil {
		return req, err
	}
	if req.From.IsZero() || req.To.IsZero() {
		return req, apperr.Errorf(apperr.Malformed, `"from" and "to" are required: a replay always takes a window (at most %d events per call)`, MaxReplay)
	}
	return req, nil
}

// Handler serves the operator endpoints on db, for a service whose relay
// runs in mode (outbox.ParseRelayMode's); logger records every change and
// every internal error. An unknown mode panics: it is a wiring mistake, and
// a handler that guessed a mode could report a requeue that will not happen.
func Handler(db outbox.DB, mode outbox.RelayMode, logger *slog.Logger) http.Handler {
	if _, err := outbox.ParseRelayMode(string(mode)); err != nil {
		panic(fmt.Sprintf("outboxhttp.Handler: %v", err))
	}
	mux := http.NewServeMux()
	fail := func(w http.ResponseWriter, r *http.Request, err error) { apperr.WriteHTTP(w, r, logger, appError(err)) }
	mux.HandleFunc("GET /dead", func(w http.ResponseWriter, r *http.Request) {
		limit := 100
		if s := r.URL.Query().Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 10_000 {
				fail(w, r, apperr.Errorf(apperr.Malformed, "limit must be an integer from 1 to 10000"))
				return
			}
			limit = n
		}
		dead, err := outboxadmin.ListDead(r.Context(), db, limit)
		if err != nil {
			fail(w, r, err)
			return
		}
		out := make([]deadEvent, len(dead))
		for i, d := range dead {
			out[i] = deadEvent{d.ID, d.EventID, d.EventType, d.AggregateType, d.AggregateID,
				d.AggregateVersion, d.Attempts, d.LastError, d.CreatedAt}
		}
		apperr.WriteJSON(w, http.StatusOK, map[string]any{"dead": out})
	})
	mux.HandleFunc("POST /requeue", func(w http.ResponseWriter, r *http.Request) {
		req, err := decode(w, r, DecodeRequeue)
		if err != nil {
			fail(w, r, err)
			return
		}
		var n int
		if len(req.IDs) > 0 {
			n, err = outboxadmin.Requeue(r.Context(), db, mode, req.IDs...)
		} else {
			limit := req.Limit
			if limit == 0 {
				limit = MaxRequeue
			}
			n, err = outboxadmin.RequeueDead(r.Context(), db, mode, outboxadmin.DeadFilter{
				AggregateType: req.AggregateType, AggregateID: req.AggregateID, Limit: limit,
			})
		}
		if err != nil {
			fail(w, r, err)
			return
		}
		logger.InfoContext(r.Context(), "outbox events requeued by an operator",
			slog.Int("requeued", n), slog.String("relay_mode", string(mode)), slog.Any("ids", req.IDs), slog.Bool("all", req.All),
			slog.String("aggregate_type", req.AggregateType), slog.String("aggregate_id", req.AggregateID),
			slog.String("remote_addr", r.RemoteAddr), slog.String("request_id", apperr.RequestID(w, r)))
		apperr.WriteJSON(w, http.StatusOK, map[string]int{"requeued": n})
	})
	mux.HandleFunc("POST /replay", func(w http.ResponseWriter, r *http.Request) {
		req, err := decode(w, r, DecodeReplay)
		if err != nil {
			fail(w, r, err)
			return
		}
		dryRun := req.DryRun == nil || *req.DryRun
		items, err := outboxadmin.Replay(r.Context(), db, mode, outboxadmin.ReplayFilter{
			AggregateType: req.AggregateType, AggregateID: req.AggregateID, From: req.From, To: req.To,
			Max: MaxReplay,
		}, dryRun)
		if err != nil {
			fail(w, r, err)
			return
		}
		out := make([]replayItem, len(items))
		for i, it := range items {
			out[i] = replayItem{it.ID, it.EventID, it.EventType, it.AggregateID, it.AggregateVersion, it.CreatedAt}
		}
		if !dryRun {
			var first, last int64
			if len(items) > 0 {
				first, last = items[0].ID, items[len(items)-1].ID
			}
			logger.InfoContext(r.Context(), "outbox events replayed by an operator",
				slog.Int("count", len(items)), slog.Int64("first_id", first), slog.Int64("last_id", last),
				slog.String("relay_mode", string(mode)),
				slog.String("aggregate_type", req.AggregateType), slog.String("aggregate_id", req.AggregateID),
				slog.Time("from", req.From), slog.Time("to", req.To),
				slog.String("remote_addr", r.RemoteAddr), slog.String("request_id", apperr.RequestID(w, r)))
		}
		apperr.WriteJSON(w, http.StatusOK, map[string]any{"dryRun": dryRun, "count": len(out), "events": out})
	})
	return mux
}

// appError gives the outbox's named errors their apperr codes: the one
// place this package decides what an outbox error means to the caller, as
// apperr.WriteHTTP is the one place a code becomes a status. The messages
// of these errors say what was wrong with the request and nothing about the
// system; anything else stays an internal error (500, details in the log).
func appError(err error) error {
	switch {
	case errors.Is(err, outboxadmin.ErrInvalidFilter), errors.Is(err, outboxadmin.ErrReplayTooLarge):
		return apperr.Errorf(apperr.Invalid, "%v", err)
	case errors.Is(err, outboxadmin.ErrNotFound):
		return apperr.Errorf(apperr.NotFound, "%v", err)
	case errors.Is(err, outboxadmin.ErrNotInThisMode):
		return apperr.Errorf(apperr.Conflict, "%v", err)
	case errors.Is(err, outbox.ErrUnavailable):
		// The driver's error stays in the chain, for the log only.
		return fmt.Errorf("%w: %w", apperr.Errorf(apperr.Unavailable, "the outbox database is unavailable; retry later"), err)
	}
	return err
}

// decode reads a bounded request body and parses it; an oversized one is
// an *http.MaxBytesError, which apperr.WriteHTTP answers with 413.
func decode[T any](w http.ResponseWriter, r *http.Request, parse func([]byte) (T, error)) (T, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var zero T
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return zero, err
		}
		return zero, apperr.Errorf(apperr.Malformed, "reading the request body failed")
	}
	return parse(b)
}

type deadEvent struct {
	ID               int64     `json:"id"`
	EventID          uuid.UUID `json:"eventId"`
	EventType        string    `json:"eventType"`
	AggregateType    string    `json:"aggregateType"`
	AggregateID      string    `json:"aggregateId"`
	AggregateVersion int64     `json:"aggregateVersion"`
	Attempts         int       `json:"attempts"`
	LastError        string    `json:"lastError"`
	CreatedAt        time.Time `json:"createdAt"`
}

type replayItem struct {
	ID               int64     `json:"id"`
	EventID          uuid.UUID `json:"eventId"`
	EventType        string    `json:"eventType"`
	AggregateID      string    `json:"aggregateId"`
	AggregateVersion int64     `json:"aggregateVersion"`
	CreatedAt        time.Time `json:"createdAt"`
}
