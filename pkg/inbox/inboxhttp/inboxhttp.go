// Package inboxhttp puts the inbox's dead-letter operations behind HTTP, with
// the standard library only, so any consuming service can mount them:
//
//	GET  /dead-letters?topic=NAME&limit=N   the dead letters (ListDeadLetters), oldest first
//	POST /dead-letters/requeue              {"topic":NAME,"eventIds":[…]} or {"topic":NAME,"all":true},
//	                                        either optionally with "consumer"
//
// NAME is one of the names the service gave its dead-letter topics, never a
// topic itself, so the endpoints cannot be pointed at arbitrary topics. Mount
// it under a prefix with http.StripPrefix. Requeuing changes what consumers
// receive: expose these endpoints only where operators, not the public, can
// reach them.
package inboxhttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/inbox"
)

// Handler serves the dead-letter endpoints. db holds the inbox, w produces
// requeued messages (it must not have a Topic of its own; see
// inbox.RequeueDeadLetters), brokers is the Kafka cluster, and dltTopics maps
// the names callers use to the dead-letter topics, e.g.
// {"orders": "orders.events.dlt"}.
func Handler(db inbox.DB, w inbox.Writer, brokers []string, dltTopics map[string]string) http.Handler {
	topics := maps.Clone(dltTopics)
	names := slices.Sorted(maps.Keys(topics))
	// lookup reports an unknown or missing name itself and returns ok=false.
	lookup := func(rw http.ResponseWriter, name string, missingStatus int) (string, bool) {
		if name == "" {
			writeError(rw, missingStatus, fmt.Sprintf("topic is required, one of: %s", strings.Join(names, ", ")))
			return "", false
		}
		topic, ok := topics[name]
		if !ok {
			writeError(rw, http.StatusNotFound, fmt.Sprintf("no dead-letter topic is named %q; known: %s", name, strings.Join(names, ", ")))
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
				writeError(rw, http.StatusBadRequest, "limit must be an integer from 1 to 10000")
				return
			}
			limit = n
		}
		name := q.Get("topic")
		topic, ok := lookup(rw, name, http.StatusBadRequest)
		if !ok {
			return
		}
		dls, err := inbox.ListDeadLetters(r.Context(), brokers, topic, limit)
		if err != nil {
			writeError(rw, http.StatusInternalServerError, err.Error())
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
		writeJSON(rw, http.StatusOK, map[string]any{
			"topic": name, "deadLetterTopic": topic, "count": len(out), "deadLetters": out,
		})
	})
	mux.HandleFunc("POST /dead-letters/requeue", func(rw http.ResponseWriter, r *http.Request) {
		var req struct {
			Topic    string      `json:"topic"`
			Consumer string      `json:"consumer"`
			EventIDs []uuid.UUID `json:"eventIds"`
			All      bool        `json:"all"`
		}
		if !decode(rw, r, &req) {
			return
		}
		topic, ok := lookup(rw, req.Topic, http.StatusUnprocessableEntity)
		if !ok {
			return
		}
		n, err := inbox.RequeueDeadLetters(r.Context(), db, w, brokers, topic, inbox.RequeueFilter{
			Consumer: req.Consumer, EventIDs: req.EventIDs, All: req.All,
		})
		switch {
		case errors.Is(err, inbox.ErrInvalidFilter):
			writeError(rw, http.StatusUnprocessableEntity, err.Error())
			return
		case err != nil:
			// Some may have been requeued before the failure; a retry is
			// safe, since the inbox absorbs what arrives twice.
			writeError(rw, http.StatusInternalServerError, fmt.Sprintf("%v (requeued before the failure: %d)", err, n))
			return
		}
		writeJSON(rw, http.StatusOK, map[string]int{"requeued": n})
	})
	return mux
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

// writeError uses the same body shape and codes as the services' own errors.
func writeError(w http.ResponseWriter, status int, msg string) {
	code := "invalid"
	switch {
	case status == http.StatusBadRequest:
		code = "malformed"
	case status == http.StatusNotFound:
		code = "not_found"
	case status >= 500:
		code = "internal"
	}
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}
