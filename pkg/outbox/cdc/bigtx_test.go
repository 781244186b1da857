package cdc_test

import "strings"

// One big transaction of the benchmarks' rows, in either mode, built by
// Postgres in one statement (BenchmarkCDCRelayProcess,
// TestCDCRelayProcessMemoryIsBounded).

// bigTxTable commits $1 outbox rows in one statement, the rows of
// fillBacklog (bench_test.go).
const bigTxTable = `
INSERT INTO outbox_events (
    event_id, aggregate_type, aggregate_id, aggregate_version,
    event_type, event_version, payload, headers, occurred_at, partition)
SELECT gen_random_uuid(), 'order', a.id, g / 10000 + 1, 'OrderPlaced', 1,
       jsonb_build_object('orderId', a.id, 'customerId', 'customer-' || g % 977,
                          'amountCents', 1000 + g % 5000, 'currency', 'EUR'),
       jsonb_build_object('correlationId', gen_random_uuid()::text,
                          'traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'),
       now(), mod(hashtext(a.id)::bigint + 2147483648, 256)
FROM generate_series(0, $1 - 1) AS g,
     LATERAL (SELECT 'order-' || g % 10000 AS id) AS a`

// emittedSQL is the content Emit writes (its binary encoding, internal/wal), as
// an SQL expression over the envelope's fields, so that a benchmark emits
// many events in one statement. Each argument is an SQL expression.
func emittedSQL(eventID, eventType, eventVersion, aggType, aggID, aggVersion, occurredAt, corr, cause, trace, payload string) string {
	text := func(expr string) string {
		return "int4send(octet_length(coalesce(" + expr + ", ''))) || convert_to(coalesce(" + expr + ", ''), 'UTF8')"
	}
	micros := func(expr string) string { return "int8send((extract(epoch FROM " + expr + ") * 1000000)::bigint)" }
	return strings.Join([]string{
		`'\x02'::bytea`, "uuid_send(" + eventID + ")", "int4send(" + eventVersion + ")", "int8send(" + aggVersion + ")",
		micros(occurredAt), text(eventType), text(aggType), text(aggID), text(corr), text(cause), text(trace),
		micros("clock_timestamp()"), "convert_to((" + payload + ")::jsonb::text, 'UTF8')",
	}, " || ")
}

// bigTxEmitted commits $1 events in one statement as Emit writes them
// under prefix $2 (WAL only), the rows of bigTxTable.
var bigTxEmitted = `
SELECT count(pg_logical_emit_message(true, $2::text, ` + emittedSQL("gen_random_uuid()", "'OrderPlaced'", "1",
	"'order'", "a.id", "g / 10000 + 1", "now()", "gen_random_uuid()::text", "''",
	"'00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'",
	"jsonb_build_object('orderId', a.id, 'customerId', 'customer-' || g % 977, 'amountCents', 1000 + g % 5000, 'currency', 'EUR')") + `))
FROM generate_series(0, $1 - 1) AS g,
     LATERAL (SELECT 'order-' || g % 10000 AS id) AS a`
