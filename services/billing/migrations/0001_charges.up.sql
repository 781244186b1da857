-- One charge per order. The primary key on order_id is the business
-- constraint behind the inbox: even an OrderPlaced re-emitted under a new
-- event id (a replay from another source) cannot charge an order twice.
CREATE TABLE charges (
    order_id     uuid        PRIMARY KEY,
    payment_id   uuid        NOT NULL UNIQUE,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    currency     char(3)     NOT NULL,
    status       text        NOT NULL CHECK (status IN ('captured', 'refunded')),
    -- The aggregate version of the payment's latest event.
    version      bigint      NOT NULL,
    captured_at  timestamptz NOT NULL,
    refunded_at  timestamptz
);
