// The shipped Debezium connector file against the outbox schema as the
// platform's owner role migrates it: it lives with the roles, since the
// libraries' tests import nothing of the platform.

package pgroles_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/platform/pgroles/pgrolestest"
	"github.com/onceflow/onceflow/platform/pgutil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// debeziumConfigFile is the connector configuration the docs ship and
// devstack/connect.sh and docker-compose.yml register as they are.
const debeziumConfigFile = "../../docs/debezium/orders-outbox-connector.json"

func readDebeziumConfig(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(debeziumConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Name   string            `json:"name"`
		Config map[string]string `json:"config"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatalf("parsing the connector file: %v", err)
	}
	if file.Name == "" || file.Config["connector.class"] != "io.debezium.connector.postgresql.PostgresConnector" {
		t.Fatalf("%s: want {name, config} with the Debezium PostgreSQL connector", debeziumConfigFile)
	}
	return file.Config
}

// placement is one entry of the EventRouter's
// table.fields.additional.placement: a column copied into a header.
type placement struct{ column, header string }

func headerPlacements(t *testing.T, cfg map[string]string) []placement {
	t.Helper()
	var out []placement
	for _, p := range strings.Split(cfg["transforms.outbox.table.fields.additional.placement"], ",") {
		parts := strings.Split(p, ":")
		if len(parts) != 3 || parts[1] != "header" {
			t.Errorf("placement %q: want column:header:name", p)
			continue
		}
		out = append(out, placement{column: parts[0], header: parts[2]})
	}
	return out
}

// debeziumHeader renders a column's value the way the connector hands it to
// Connect's SimpleHeaderConverter, by the column's Postgres type (Debezium's
// PostgreSQL type mapping: uuid and text as strings, integers as numbers,
// timestamptz as io.debezium.time.ZonedTimestamp, ISO-8601 in UTC). A type
// it does not know fails the test: whoever places a new column must look up
// how Debezium renders it.
func debeziumHeader(t *testing.T, typ string, v any) []byte {
	t.Helper()
	if v == nil {
		return nil
	}
	switch typ {
	case "uuid", "text", "integer", "bigint", "smallint":
		switch x := v.(type) {
		case [16]byte:
			return []byte(uuid.UUID(x).String())
		case string:
			return []byte(x)
		default:
			b, _ := json.Marshal(x)
			return b
		}
	case "timestamp with time zone":
		return []byte(v.(time.Time).UTC().Format(time.RFC3339Nano))
	}
	t.Fatalf("a placed column of type %s: how does Debezium render it as a header?", typ)
	return nil
}

// TestDebeziumConfigMatchesTheSchema checks the shipped connector file
// against what the migrations make of a database, migrated as the
// least-privilege owner as the services migrate, without running Kafka
// Connect (devstack/connect.sh and the proofs' debezium mode run it):
//   - every column it names exists, and has the type the setting needs
//     (the EventRouter's event timestamp must be an epoch integer; a
//     timestamptz killed the task on the first row);
//   - an event enqueued with every envelope field, placed into headers as
//     Debezium renders its columns, decodes with event.FromKafka to the same
//     envelope, with the same headers as the platform's relays write
//     (correlation id, causation id and traceparent included), and the
//     CloudEvents headers with the relays' values (InsertField and
//     HeaderFrom for the constant ones);
//   - the publication it reads exists after the owner's migration, on
//     outbox_events only, inserts only.
func TestDebeziumConfigMatchesTheSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := readDebeziumConfig(t)

	db := testinfra.NewDatabase(t)
	roles := pgrolestest.Ensure(t, db, "orders")
	owner := testinfra.NewPool(t, roles.OwnerURL)
	if err := pgutil.Migrate(owner, pgutil.Migration{FS: outbox.Migrations, Table: outbox.MigrationsTable}); err != nil {
		t.Fatalf("migrating as the owner role: %v", err)
	}
	app := testinfra.NewPool(t, roles.AppURL)

	rows, err := owner.Query(ctx, `SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'outbox_events'`)
	if err != nil {
		t.Fatal(err)
	}
	columns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var c [2]string
		return c, r.Scan(&c[0], &c[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	typeOf := map[string]string{}
	for _, c := range columns {
		typeOf[c[0]] = c[1]
	}

	// What each setting needs of its column, as the EventRouter reads it
	// (io.debezium.transforms.outbox.EventRouterDelegate).
	for setting, types := range map[string][]string{
		"table.field.event.id":      {"uuid", "text"},
		"table.field.event.key":     {"text"},
		"table.field.event.payload": {"jsonb"},
		"route.by.field":            {"text"},
		// Read with Struct.getInt64: an INT64 field, which only bigint is.
		// Unset, the record carries the change event's own timestamp, as
		// our relays' records carry their publish time.
		"table.field.event.timestamp": {"bigint"},
	} {
		col, set := cfg["transforms.outbox."+setting]
		if !set && setting == "table.field.event.timestamp" {
			continue
		}
		if !slices.Contains(types, typeOf[col]) {
			t.Errorf("%s names column %q of type %q; the EventRouter needs one of %v", setting, col, typeOf[col], types)
		}
	}
	if cfg["transforms.outbox.table.field.event.key"] != "aggregate_id" || cfg["transforms.outbox.table.field.event.payload"] != "payload" {
		t.Errorf("key and value must be aggregate_id and payload, as the relays publish them")
	}

	// An event with every field, enqueued as the service writes it.
	want := event.Envelope{
		EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 2,
		AggregateType: "order", AggregateID: uuid.NewString(), AggregateVersion: 7,
		OccurredAt:    time.Date(2026, 6, 8, 9, 14, 32, 118123000, time.UTC),
		CorrelationID: "corr-" + uuid.NewString(), CausationID: "cause-" + uuid.NewString(),
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Payload:     json.RawMessage(`{"order_id": "x", "amount_cents": 1250}`),
	}
	tx, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Enqueue(ctx, tx, want); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	msg := kafka.Message{Key: []byte(want.AggregateID), Value: want.Payload}
	for _, p := range headerPlacements(t, cfg) {
		typ, ok := typeOf[p.column]
		if !ok {
			t.Errorf("header %s is placed from column %q, which outbox_events does not have", p.header, p.column)
			continue
		}
		var v any
		if err := app.QueryRow(ctx, `SELECT `+pgx.Identifier{p.column}.Sanitize()+` FROM outbox_events WHERE event_id = $1`,
			want.EventID).Scan(&v); err != nil {
			t.Fatalf("reading column %s: %v", p.column, err)
		}
		msg.Headers = append(msg.Headers, kafka.Header{Key: p.header, Value: debeziumHeader(t, typ, v)})
	}
	// Headers of a constant value (ce_specversion, ce_source) come from
	// Kafka Connect's transforms, run before the EventRouter: InsertField
	// adds each as a string field of the change event, HeaderFrom moves it
	// into a header. (InsertHeader cannot: it parses its literal, and
	// "1.0" becomes the number 1, written as "1".)
	static := map[string]string{}
	for _, name := range strings.Split(cfg["transforms"], ",") {
		prefix := "transforms." + name + "."
		switch cfg[prefix+"type"] {
		case "org.apache.kafka.connect.transforms.InsertField$Value":
			static[cfg[prefix+"static.field"]] = cfg[prefix+"static.value"]
		case "org.apache.kafka.connect.transforms.HeaderFrom$Value":
			fields, headers := strings.Split(cfg[prefix+"fields"], ","), strings.Split(cfg[prefix+"headers"], ",")
			if len(fields) != len(headers) || cfg[prefix+"operation"] != "move" {
				t.Fatalf("%s: want as many fields as headers, moved", name)
			}
			for i, f := range fields {
				v, ok := static[f]
				if !ok {
					t.Fatalf("%s moves field %s, which no InsertField before it adds", name, f)
				}
				msg.Headers = append(msg.Headers, kafka.Header{Key: headers[i], Value: []byte(v)})
			}
		}
	}
	got, err := event.FromKafka(msg)
	if err != nil {
		t.Fatalf("the event as Debezium would publish it does not decode: %v", err)
	}
	if !got.OccurredAt.Equal(want.OccurredAt) {
		t.Errorf("occurred-at: got %v, want %v", got.OccurredAt, want.OccurredAt)
	}
	got.OccurredAt, got.Payload = want.OccurredAt, want.Payload
	if gotJSON, wantJSON := mustJSON(t, got), mustJSON(t, want); gotJSON != wantJSON {
		t.Errorf("the event as Debezium would publish it decodes to\n%s\nwant (as the relays publish it)\n%s", gotJSON, wantJSON)
	}
	// The same header names as the platform's relays write, no more, no fewer.
	var relayHeaders, placed []string
	for _, h := range event.ToKafka("t", want).Headers {
		relayHeaders = append(relayHeaders, h.Key)
	}
	for _, h := range msg.Headers {
		placed = append(placed, h.Key)
	}
	slices.Sort(relayHeaders)
	slices.Sort(placed)
	if !slices.Equal(relayHeaders, placed) {
		t.Errorf("headers placed %v, the relays write %v", placed, relayHeaders)
	}
	// The CloudEvents headers carry what the relays' carry: the constants
	// are the relays' for the one aggregate type this connector routes
	// ("order").
	relay := map[string]string{}
	for _, h := range event.ToKafka("t", want).Headers {
		relay[h.Key] = string(h.Value)
	}
	for _, h := range msg.Headers {
		if strings.HasPrefix(h.Key, "ce_") && string(h.Value) != relay[h.Key] {
			t.Errorf("Debezium's %s would be %q, the relays write %q", h.Key, h.Value, relay[h.Key])
		}
	}

	var pubTables []string
	var inserts, updates, deletes bool
	if err := owner.QueryRow(ctx, `
SELECT coalesce((SELECT array_agg(tablename::text) FROM pg_publication_tables WHERE pubname = p.pubname), '{}'),
       p.pubinsert, p.pubupdate, p.pubdelete
FROM pg_publication p WHERE p.pubname = $1`, cfg["publication.name"]).Scan(&pubTables, &inserts, &updates, &deletes); err != nil {
		t.Fatalf("publication %q after migrating as the owner role: %v (the connector does not create it: publication.autocreate.mode %q)",
			cfg["publication.name"], err, cfg["publication.autocreate.mode"])
	}
	if !slices.Equal(pubTables, []string{"outbox_events"}) || !inserts || updates || deletes {
		t.Errorf("publication %s covers %v (insert %v, update %v, delete %v); want outbox_events, inserts only",
			cfg["publication.name"], pubTables, inserts, updates, deletes)
	}
	if cfg["publication.name"] != cdc.Publication || cfg["table.include.list"] != "public.outbox_events" || cfg["plugin.name"] != "pgoutput" {
		t.Errorf("publication.name, table.include.list and plugin.name must be %s, public.outbox_events and pgoutput", cdc.Publication)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
