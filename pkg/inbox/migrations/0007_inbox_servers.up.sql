-- inbox_servers: lease mode, the database server each consumer last wrote
-- its leases to (lease_server.go). A failover with asynchronous replication
-- loses the old primary's last commits, among them lease rows that recorded
-- a call; the row of this table, written long before, survives on the
-- promoted standby and names the old server. The first lease transaction on
-- the new one sees the difference and records the switch: check_before is
-- when it did, plus a margin for producers' clocks, and a message with no
-- row whose Kafka timestamp is older is leased as may_have_called, so its
-- first call is preceded by Effect.Check.
CREATE TABLE inbox_servers (
    consumer     text        PRIMARY KEY,
    -- address:port and postmaster start of the server (lease_server.go).
    server       text        NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    switched_at  timestamptz,
    check_before timestamptz
);
