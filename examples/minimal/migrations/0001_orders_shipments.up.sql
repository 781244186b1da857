-- The service's own tables. The outbox's and the inbox's come from their
-- libraries' migrations (outbox.Migrate, inbox.Migrate), tracked apart.
CREATE TABLE orders (
    id           uuid PRIMARY KEY,
    amount_cents bigint NOT NULL
);

CREATE TABLE shipments (
    order_id   text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
