-- 0017: per-key concurrency (docs/design.md, "Per-key limits"). An item's concurrency key, the
-- account or resource its unit acts on (NULL: none, not limited by it), copied to the unit's
-- later stages at each hand-off. A claim of a stage with max_per_key counts the claimed items
-- of each key from the rows themselves, through wl_items_keyed_claimed: as many entries as
-- keyed items are in flight, however many are pending or done.
ALTER TABLE wl_items ADD COLUMN concurrency_key text;
CREATE INDEX wl_items_keyed_claimed ON wl_items (stage, concurrency_key)
    WHERE state = 'claimed' AND concurrency_key IS NOT NULL;
