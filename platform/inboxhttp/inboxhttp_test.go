package inboxhttp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/platform/inboxhttp"
	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

func TestHandlerDeadLetterEndpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testinfra.KafkaBrokers(t)
	pool := inboxtest.NewDatabase(t)
	original := testinfra.NewTopic(t, brokers, 1)
	dlt := original + ".dlt"
	testinfra.NewTopicNamed(t, brokers, dlt, 1)
	w := kafkautil.NewWriter(brokers, 10)
	defer w.Close()

	evs := make([]event.Envelope, 2)
	for i := range evs {
		evs[i] = event.Envelope{
			EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
			AggregateID: fmt.Sprint("o-", i), AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`),
		}
		m := event.ToKafka(original, evs[i])
		dl := kafka.Message{Topic: dlt, Key: m.Key, Value: m.Value, Headers: append(m.Headers,
			kafka.Header{Key: inboxadmin.HeaderDLTReason, Value: []byte(fmt.Sprint("reason ", i))},
			kafka.Header{Key: inboxadmin.HeaderDLTConsumer, Value: []byte("billing")},
			kafka.Header{Key: inboxadmin.HeaderDLTTopic, Value: []byte(original)},
			kafka.Header{Key: inboxadmin.HeaderDLTPartition, Value: []byte("0")},
			kafka.Header{Key: inboxadmin.HeaderDLTOffset, Value: []byte(fmt.Sprint(10 + i))},
			kafka.Header{Key: inboxadmin.HeaderDLTFailedAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		)}
		if err := w.WriteMessages(ctx, dl); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id,
			aggregate_version, topic, kafka_partition, kafka_offset, status, last_error, payload_hash)
			VALUES ('billing', $1, 'OrderPlaced', $2, 1, $3, 0, $4, 'dead_lettered', 'boom', '\x00')`,
			evs[i].EventID, evs[i].AggregateID, original, 10+i); err != nil {
			t.Fatal(err)
		}
	}

	srv := httptest.NewServer(http.StripPrefix("/admin/inbox", inboxhttp.Handler(pool, w, brokers, map[string]string{"orders": dlt}, slog.New(slog.NewTextHandler(io.Discard, nil)))))
	defer srv.Close()

	call := func(method, path, body string, wantStatus int) map[string]any {
		t.Helper()
		return testinfra.CallJSON(t, method, srv.URL+"/admin/inbox"+path, body, wantStatus)
	}
	errorCode := func(out map[string]any) string {
		t.Helper()
		e, _ := out["error"].(map[string]any)
		if e == nil || e["message"] == "" {
			t.Fatalf("error body = %v, want {\"error\":{\"code\":…,\"message\":…}}", out)
		}
		return fmt.Sprint(e["code"])
	}
	// remaining lists the dead letters still pending: a requeue marks the
	// row requeued (its redelivery applies it).
	remaining := func() []string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT message_id::text FROM inbox_messages WHERE status = 'dead_lettered' ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var ids []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	originalOffsets := func(want int64) {
		t.Helper()
		var last int64
		testinfra.WaitFor(t, 20*time.Second, fmt.Sprintf("%d messages in the original topic", want), func() (bool, error) {
			conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], original, 0)
			if err != nil {
				return false, err
			}
			defer conn.Close()
			_, last, err = conn.ReadOffsets()
			return err == nil && last >= want, err
		})
		if last != want {
			t.Fatalf("the original topic holds %d messages, want %d", last, want)
		}
	}

	list := call("GET", "/dead-letters?topic=orders", "", 200)
	dls := list["deadLetters"].([]any)
	if list["count"] != float64(2) || list["deadLetterTopic"] != dlt || len(dls) != 2 {
		t.Fatalf("list = %v, want the 2 dead letters of %s", list, dlt)
	}
	for i, d := range dls {
		d := d.(map[string]any)
		if d["eventId"] != evs[i].EventID.String() || d["reason"] != fmt.Sprint("reason ", i) ||
			d["consumer"] != "billing" || d["originalTopic"] != original || d["originalOffset"] != float64(10+i) ||
			d["offset"] != float64(i) || d["keySize"] != float64(len(evs[i].AggregateID)) {
			t.Fatalf("dead letter %d = %v", i, d)
		}
	}
	if got := call("GET", "/dead-letters?topic=orders&limit=1", "", 200)["count"]; got != float64(1) {
		t.Fatalf("count with limit=1 = %v, want 1", got)
	}
	if code := errorCode(call("GET", "/dead-letters?topic=orders&limit=0", "", 400)); code != "malformed" {
		t.Fatalf("limit=0: code %s, want malformed", code)
	}
	if code := errorCode(call("GET", "/dead-letters", "", 400)); code != "malformed" {
		t.Fatalf("no topic: code %s, want malformed", code)
	}
	// Only configured names, never raw topic names.
	if code := errorCode(call("GET", "/dead-letters?topic="+dlt, "", 404)); code != "not_found" {
		t.Fatalf("unknown name: code %s, want not_found", code)
	}
	for _, body := range []string{`{}`, `{"topic":"orders"}`, `{"topic":"orders","all":true,"limit":-1}`,
		`{"topic":"orders","all":true,"limit":1001}`, `{"topic":"orders","all":true,"after":"garbage"}`,
		`{"topic":"orders","all":true,"eventIds":["` + evs[0].EventID.String() + `"]}`} {
		if code := errorCode(call("POST", "/dead-letters/requeue", body, 400)); code != "malformed" {
			t.Fatalf("%s: code %s, want malformed", body, code)
		}
	}
	errorCode(call("POST", "/dead-letters/requeue", `{"eventIds":["`+evs[0].EventID.String()+`"]}`, 422))
	errorCode(call("POST", "/dead-letters/requeue", `{"topic":"payments","all":true}`, 404))
	errorCode(call("POST", "/dead-letters/requeue", `{"topic":"orders","al":true}`, 400))
	errorCode(call("POST", "/dead-letters/requeue", `{"topic":"orders","eventIds":["not-a-uuid"]}`, 400))
	errorCode(call("POST", "/dead-letters/requeue", `{"topic":"orders","eventIds":[]}`, 400))
	errorCode(call("POST", "/dead-letters/requeue", `{"TOPIC":"orders","all":true}`, 400))
	// Unknown ids get the outbox requeue's answer: 404 not_found, nothing
	// requeued, never 200 "requeued": 0.
	if code := errorCode(call("POST", "/dead-letters/requeue", `{"topic":"orders","eventIds":["`+uuid.NewString()+`"]}`, 404)); code != "not_found" {
		t.Fatalf("unknown event id: code %s, want not_found as the outbox requeue answers", code)
	}
	errorCode(call("POST", "/dead-letters/requeue", `{"topic":"orders","all":true}x`, 400))
	if ids := remaining(); len(ids) != 2 {
		t.Fatalf("refused requests changed the inbox: %v", ids)
	}
	originalOffsets(0)

	body := `{"topic":"orders","eventIds":["` + evs[1].EventID.String() + `"]}`
	if got := call("POST", "/dead-letters/requeue", body, 200)["requeued"]; got != float64(1) {
		t.Fatalf("requeued = %v, want 1", got)
	}
	originalOffsets(1)
	if ids := remaining(); !slices.Equal(ids, []string{evs[0].EventID.String()}) {
		t.Fatalf("inbox rows after requeuing the second = %v, want only the first's", ids)
	}
	// A sweep one letter per call: the first is pending, the second was
	// requeued above; then the pass is done, and a new one finds nothing.
	first := call("POST", "/dead-letters/requeue", `{"topic":"orders","all":true,"limit":1}`, 200)
	if first["requeued"] != float64(1) || first["next"] == "" {
		t.Fatalf("first call of the sweep = %v, want 1 requeued and a cursor", first)
	}
	second := call("POST", "/dead-letters/requeue", fmt.Sprintf(`{"topic":"orders","all":true,"limit":1,"after":%q}`, first["next"]), 200)
	if second["requeued"] != float64(0) || second["next"] != "" {
		t.Fatalf("second call of the sweep = %v, want nothing requeued and \"next\": \"\"", second)
	}
	originalOffsets(2)
	if ids := remaining(); len(ids) != 0 {
		t.Fatalf("inbox rows after requeuing all = %v, want none", ids)
	}
	if again := call("POST", "/dead-letters/requeue", `{"topic":"orders","all":true}`, 200); again["requeued"] != float64(0) || again["next"] != "" {
		t.Fatalf("a new sweep = %v, want nothing left", again)
	}
	originalOffsets(2)
}

func TestHandlerListsParkedEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testinfra.KafkaBrokers(t)
	pool := inboxtest.NewDatabase(t)
	w := kafkautil.NewWriter(brokers, 10)
	defer w.Close()
	dead, later := uuid.New(), uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO inbox_parked_messages (consumer, message_id, aggregate_type, aggregate_id,
		aggregate_version, event_type, blocked_by, topic, kafka_partition, kafka_offset, msg_key, msg_value)
		VALUES ('billing', $1, 'order', 'o-1', 2, 'PaymentRefunded', $2, 'orders.events', 0, 7, 'o-1', '{}')`, later, dead); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(inboxhttp.Handler(pool, w, brokers, map[string]string{"orders": "orders.events.dlt"}, slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer srv.Close()

	out := testinfra.CallJSON(t, http.MethodGet, srv.URL+"/parked?consumer=billing", "", http.StatusOK)
	ps, _ := out["parked"].([]any)
	if len(ps) != 1 {
		t.Fatalf("GET /parked = %v, want the one parked event", out)
	}
	p := ps[0].(map[string]any)
	if p["eventId"] != later.String() || p["blockedBy"] != dead.String() || p["aggregateVersion"] != float64(2) || p["aggregateId"] != "o-1" {
		t.Fatalf("parked event = %v", p)
	}
	if out := testinfra.CallJSON(t, http.MethodGet, srv.URL+"/parked?consumer=shipping", "", http.StatusOK); out["count"] != float64(0) {
		t.Fatalf("another consumer's parked events = %v, want none", out)
	}
	testinfra.CallJSON(t, http.MethodGet, srv.URL+"/parked?limit=0", "", http.StatusBadRequest)
}

// A held aggregate is released or skipped with a reason; a second action
// finds nothing held (404), a missing reason is refused (400).
func TestHandlerReleasesAndSkipsHeldAggregates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testinfra.KafkaBrokers(t)
	pool := inboxtest.NewDatabase(t)
	w := kafkautil.NewWriter(brokers, 10)
	defer w.Close()
	hold := func(aggregate string) (dead, later uuid.UUID) {
		dead, later = uuid.New(), uuid.New()
		if _, err := pool.Exec(ctx, `INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_type, aggregate_id,
			aggregate_version, topic, kafka_partition, kafka_offset, status, payload_hash)
			VALUES ('billing', $1, 'PaymentCaptured', 'order', $2, 1, 'orders.events', 0, 6, 'dead_lettered', '\x00')`, dead, aggregate); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO inbox_dead_keys (consumer, message_id, aggregate_type, aggregate_id, aggregate_version)
			VALUES ('billing', $1, 'order', $2, 1)`, dead, aggregate); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO inbox_parked_messages (consumer, message_id, aggregate_type, aggregate_id,
			aggregate_version, event_type, blocked_by, topic, kafka_partition, kafka_offset, msg_key, msg_value)
			VALUES ('billing', $1, 'order', $2, 2, 'PaymentRefunded', $3, 'orders.events', 0, 7, $4, '{}')`, later, aggregate, dead, []byte(aggregate)); err != nil {
			t.Fatal(err)
		}
		return dead, later
	}
	srv := httptest.NewServer(inboxhttp.Handler(pool, w, brokers, map[string]string{"orders": "orders.events.dlt"}, slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer srv.Close()

	dead, _ := hold("o-1")
	testinfra.CallJSON(t, http.MethodPost, srv.URL+"/parked/release", `{"consumer":"billing","aggregateType":"order","aggregateId":"o-1"}`, http.StatusBadRequest)
	body := `{"consumer":"billing","aggregateType":"order","aggregateId":"o-1","reason":"its dead letter expired","operator":"alice"}`
	out := testinfra.CallJSON(t, http.MethodPost, srv.URL+"/parked/release", body, http.StatusOK)
	if d, _ := out["dead"].([]any); len(d) != 1 || d[0] != dead.String() || out["parked"] != float64(1) {
		t.Fatalf("POST /parked/release = %v, want the dead event and one parked", out)
	}
	testinfra.CallJSON(t, http.MethodPost, srv.URL+"/parked/release", body, http.StatusNotFound)

	_, later := hold("o-2")
	out = testinfra.CallJSON(t, http.MethodPost, srv.URL+"/parked/skip",
		`{"consumer":"billing","aggregateType":"order","aggregateId":"o-2","reason":"cancelled upstream"}`, http.StatusOK)
	if out["parked"] != float64(1) {
		t.Fatalf("POST /parked/skip = %v, want one parked event skipped", out)
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM inbox_messages WHERE message_id = $1`, later).Scan(&status); err != nil || status != "skipped" {
		t.Fatalf("the skipped parked event's row is %q (%v), want skipped", status, err)
	}
}
