-- 0004: when the handler of an item's current claim started (NULL: not started under it).
-- Workers record it, just before the handler runs, for items of a stage that is not idempotent
-- (and for an item run alone after its holder vanished). When such an item's lease expires,
-- the sweeper can then tell an item whose handler may have had its effect (unknown, or its
-- verify hook asked) from one its holder never started (back to pending, nothing to doubt).
-- A nullable column without a default: no table rewrite.
ALTER TABLE wl_items ADD COLUMN started_at timestamptz;
-- Items claimed by a worker of an older version carry no start: count them as started, so that
-- the sweeper doubts them (unknown, or asks the verify hook) rather than running them again.
UPDATE wl_items SET started_at = updated_at WHERE state = 'claimed';
