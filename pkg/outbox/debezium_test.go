package outbox_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// The Debezium EventRouter configuration (docs/debezium) names columns of
// outbox_events and our header names; a migration that renames a column, or
// a header renamed in pkg/event, must fail here rather than in production.
func TestDebeziumConfigMatchesTheSchema(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/debezium/orders-outbox-connector.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Config map[string]string `json:"config"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatalf("parsing the connector file: %v", err)
	}
	cfg := file.Config

	pool := newOutboxDB(t)
	rows, err := pool.Query(context.Background(),
		`SELECT column_name FROM information_schema.columns WHERE table_name = 'outbox_events'`)
	if err != nil {
		t.Fatal(err)
	}
	columns := map[string]bool{}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		columns[c] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	named := map[string]string{} // column -> the setting naming it
	for _, k := range []string{"table.field.event.id", "table.field.event.key", "table.field.event.payload",
		"table.field.event.timestamp", "route.by.field"} {
		named[cfg["transforms.outbox."+k]] = k
	}
	headers := map[string]string{} // header -> column
	for _, p := range strings.Split(cfg["transforms.outbox.table.fields.additional.placement"], ",") {
		parts := strings.Split(p, ":")
		if len(parts) != 3 || parts[1] != "header" {
			t.Errorf("placement %q: want column:header:name", p)
			continue
		}
		named[parts[0]] = "additional.placement"
		headers[parts[2]] = parts[0]
	}
	for col, setting := range named {
		if !columns[col] {
			t.Errorf("%s names column %q, which outbox_events does not have", setting, col)
		}
	}
	if cfg["transforms.outbox.table.field.event.key"] != "aggregate_id" || cfg["transforms.outbox.table.field.event.payload"] != "payload" {
		t.Errorf("key and value must be aggregate_id and payload, as the relays publish them")
	}
	for header, col := range map[string]string{
		event.HeaderEventID: "event_id", event.HeaderEventType: "event_type", event.HeaderEventVersion: "event_version",
		event.HeaderAggregateType: "aggregate_type", event.HeaderAggregateID: "aggregate_id",
		event.HeaderAggregateVersion: "aggregate_version", event.HeaderOccurredAt: "occurred_at",
	} {
		if headers[header] != col {
			t.Errorf("header %s: placed from %q, want column %s", header, headers[header], col)
		}
	}
	if got := cfg["publication.name"]; got != outbox.Publication {
		t.Errorf("publication.name = %q, want %q (migration 0005)", got, outbox.Publication)
	}
	if cfg["table.include.list"] != "public.outbox_events" || cfg["plugin.name"] != "pgoutput" {
		t.Errorf("table.include.list and plugin.name must be public.outbox_events and pgoutput")
	}
}
