-- Wake relays only when one is waiting.
--
-- NOTIFY is not free: at commit PostgreSQL takes a cluster-wide lock
-- (PreCommit_Notify) and holds it until the commit record is flushed, so
-- every notifying transaction commits alone, without group commit. Migration
-- 0001 notified on every outbox insert, which capped outbox transactions at
-- one WAL flush each. Now a relay says when it is about to sleep
-- (outbox_relays.waiting) and writers notify only then; a busy relay does not
-- need waking, it claims again as soon as a batch is done.
--
-- The race between "writer checks the flag" and "relay arms and sleeps" is
-- closed with an advisory lock (class 0x6f627831 = 1868724273, key -1; see
-- wakeFenceKey in relay.go): a writer holds it shared from the check until its
-- transaction ends; a relay arms by setting waiting and then taking it
-- exclusively, which waits for every writer that may have seen the flag
-- unset. After that, every such writer has committed (the relay's next claim
-- sees its rows) and every later writer sees the flag and notifies.
ALTER TABLE outbox_relays ADD COLUMN waiting boolean NOT NULL DEFAULT false;

DROP TRIGGER outbox_events_notify ON outbox_events;

CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A deferred row trigger fires once per inserted row at commit; decide once
    -- per transaction.
    IF current_setting('onceflow.outbox_wake_checked', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('onceflow.outbox_wake_checked', 'on', true);
    PERFORM pg_advisory_xact_lock_shared(1868724273, -1);
    -- Under REPEATABLE READ or SERIALIZABLE the flag would be read from the
    -- transaction's old snapshot, so such writers always notify.
    IF current_setting('transaction_isolation') <> 'read committed'
       OR EXISTS (SELECT 1 FROM outbox_relays WHERE waiting) THEN
        PERFORM pg_notify('outbox_events', '');
    END IF;
    RETURN NULL;
END $$;

-- Deferred to commit, so the shared lock is held only for the commit itself.
CREATE CONSTRAINT TRIGGER outbox_events_notify
    AFTER INSERT ON outbox_events
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION outbox_events_notify();
