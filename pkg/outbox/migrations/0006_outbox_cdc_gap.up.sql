-- A new replication slot streams from its creation only. Rows committed
-- before it and never published (the window of a lost slot: dropped,
-- invalidated by max_slot_wal_keep_size, not carried over a failover; or
-- rows the polling relay left pending) are in no stream. The log-based
-- relay sets gap_pending when it creates or adopts a slot, republishes the
-- table's pending rows in id order before it streams, and clears it; until
-- then its retention deletes nothing, because the new slot's confirmed id
-- soon passes the gap's rows. It is a column, not the relay's memory, so a
-- relay that dies during the replay leaves it to its successor.
ALTER TABLE outbox_cdc_slots ADD COLUMN gap_pending boolean NOT NULL DEFAULT false;
