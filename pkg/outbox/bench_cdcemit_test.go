package outbox_test

// benchBigTxEmitted commits $1 events in one statement as Emit writes them
// under prefix $2 (WAL only), the rows of bigTxTable.
const benchBigTxEmitted = `
SELECT count(pg_logical_emit_message(true, $2::text, convert_to(jsonb_build_object(
    'eventId', gen_random_uuid(), 'eventType', 'OrderPlaced', 'eventVersion', 1,
    'aggregateType', 'order', 'aggregateId', a.id, 'aggregateVersion', g / 10000 + 1,
    'occurredAt', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'correlationId', gen_random_uuid()::text, 'causationId', '',
    'traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
    'payload', jsonb_build_object('orderId', a.id, 'customerId', 'customer-' || g % 977,
                                  'amountCents', 1000 + g % 5000, 'currency', 'EUR'),
    'emittedAt', clock_timestamp())::text, 'UTF8')))
FROM generate_series(0, $1 - 1) AS g,
     LATERAL (SELECT 'order-' || g % 10000 AS id) AS a`
