// Package outboxhttp puts the outbox's operator functions behind HTTP, with
// the standard library only, so any service can mount them:
//
//	GET  /dead?limit=N   the dead events (ListDead), newest rows last
//	POST /requeue        {"ids":[…]} or {"aggregateType":…,"aggregateId":…,"limit":N}
//	POST /replay         {"aggregateType":…,"aggregateId":…,"from":…,"to":…,"dryRun":true}
//
// Mount it under a prefix with http.StripPrefix. These endpoints change what
// a service publishes: expose them only where operators, not the public, can
// reach them.
package outboxhttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// Handler serves the operator endpoints on db.
func Handler(db outbox.DB) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /dead", func(w http.ResponseWriter, r *http.Request) {
		limit := 100
		if s := r.URL.Query().Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 10_000 {
				writeError(w, http.StatusBadRequest, "limit must be an integer from 1 to 10000")
				return
			}
			limit = n
		}
		dead, err := outbox.ListDead(r.Context(), db, limit)
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		out := make([]deadEvent, len(dead))
		for i, d := range dead {
			out[i] = deadEvent{d.ID, d.EventID, d.EventType, d.AggregateType, d.AggregateID,
				d.AggregateVersion, d.Attempts, d.LastError, d.CreatedAt}
		}
		writeJSON(w, http.StatusOK, map[string]any{"dead": out})
	})
	mux.HandleFunc("POST /requeue", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			IDs           []int64 `json:"ids"`
			AggregateType string  `json:"aggregateType"`
			AggregateID   string  `json:"aggregateId"`
			Limit         int     `json:"limit"`
		}
		if !decode(w, r, &req) {
			return
		}
		var (
			n   int
			err error
		)
		if len(req.IDs) > 0 {
			n, err = outbox.Requeue(r.Context(), db, req.IDs...)
		} else {
			n, err = outbox.RequeueDead(r.Context(), db, outbox.DeadFilter{
				AggregateType: req.AggregateType, AggregateID: req.AggregateID, Limit: req.Limit,
			})
		}
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]int{"requeued": n})
	})
	mux.HandleFunc("POST /replay", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			AggregateType string    `json:"aggregateType"`
			AggregateID   string    `json:"aggregateId"`
			From          time.Time `json:"from"`
			To            time.Time `json:"to"`
			DryRun        bool      `json:"dryRun"`
		}
		if !decode(w, r, &req) {
			return
		}
		items, err := outbox.Replay(r.Context(), db, outbox.ReplayFilter{
			AggregateType: req.AggregateType, AggregateID: req.AggregateID, From: req.From, To: req.To,
		}, req.DryRun)
		switch {
		case errors.Is(err, outbox.ErrInvalidFilter), errors.Is(err, outbox.ErrReplayTooLarge):
			writeError(w, http.StatusUnprocessableEntity, err.Error())
			return
		case err != nil:
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		out := make([]replayItem, len(items))
		for i, it := range items {
			out[i] = replayItem{it.ID, it.EventID, it.EventType, it.AggregateID, it.AggregateVersion, it.CreatedAt}
		}
		writeJSON(w, http.StatusOK, map[string]any{"dryRun": req.DryRun, "count": len(out), "events": out})
	})
	return mux
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

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("request body is not valid JSON for this endpoint: %v", err))
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError uses the same body shape as the services' own errors.
func writeError(w http.ResponseWriter, status int, msg string) {
	code := "invalid"
	switch {
	case status == http.StatusBadRequest:
		code = "malformed"
	case status >= 500:
		code = "internal"
	}
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}
