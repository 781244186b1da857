CREATE TABLE orders (
    id           uuid        PRIMARY KEY,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    currency     char(3)     NOT NULL,
    status       text        NOT NULL CHECK (status IN ('placed', 'cancelled')),
    -- Incremented by every change; it is the aggregate version of the event
    -- the change emits, so consumers can order and dedupe by it.
    version      bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per Idempotency-Key a client sent with POST /orders: a retry with
-- the same key and body returns the original order instead of a second one.
CREATE TABLE idempotency_keys (
    key          text        PRIMARY KEY,
    request_hash bytea       NOT NULL,
    order_id     uuid        NOT NULL REFERENCES orders (id),
    created_at   timestamptz NOT NULL DEFAULT now()
);
