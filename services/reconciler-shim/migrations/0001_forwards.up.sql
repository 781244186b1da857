-- The shim's record of what it forwarded to the third-party reconciler, one
-- row per payment event, written in the transaction that marks the inbox row
-- done after the call.
CREATE TABLE forwards (
    event_id      uuid        PRIMARY KEY,
    event_type    text        NOT NULL,
    order_id      uuid        NOT NULL,
    kind          text        NOT NULL CHECK (kind IN ('capture', 'refund')),
    -- sent: this delivery made the call.
    -- already_present: the third party already had the idempotency key (an
    -- earlier delivery called out, then crashed before committing).
    outcome       text        NOT NULL CHECK (outcome IN ('sent', 'already_present')),
    settlement_id text,
    forwarded_at  timestamptz NOT NULL DEFAULT now()
);
