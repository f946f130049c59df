-- 0007: dispatch through a broker (docs/design.md, "Dispatch through a broker").
-- redispatch_at: when the sweeper publishes a message for the item again if it is still
-- pending and unclaimed by then; NULL: the item is not dispatched through a broker (the
-- ledger's own workers claim it). Set before a message is published (an outbox: a process
-- that dies between its commit and its publish leaves the item owed, not lost), to the claim's
-- time by a broker task's claim (so the item is owed a message as soon as it is pending again)
-- and copied by a hand-off. dispatches: messages published for it since its last claim, the
-- exponent of the wait before the next one (a queue's backlog is not flooded with copies).
-- Nullable and defaulted columns: no table rewrite.
ALTER TABLE wl_items ADD COLUMN redispatch_at TEXT;
ALTER TABLE wl_items ADD COLUMN dispatches INTEGER NOT NULL DEFAULT 0;
-- The sweeper's re-dispatch walks only pending items owed a message, per run, oldest first:
-- empty in a ledger without a broker, and never the items whose messages are still fresh.
CREATE INDEX wl_items_owed ON wl_items (run_id, redispatch_at)
    WHERE state = 'pending' AND redispatch_at IS NOT NULL;
