-- 0013: a broker task's held-back messages wait until their stage's bucket can serve them.
-- wl_stage_limits.held_until: the bucket's reservation horizon, until when its refill is
-- promised to messages held back already, so that the next is held until after them (spaced at
-- the rate, not all tried again at once). wl_items.held_until: until when a pending item is
-- held for the message published for it; a copy of an earlier message, or a message no bucket
-- held, claims nothing of it before then and holds nothing again. NULL: not held.
ALTER TABLE wl_stage_limits ADD COLUMN held_until timestamp with time zone;
ALTER TABLE wl_items ADD COLUMN held_until timestamp with time zone;
