-- 0006: runs recorded inside the caller's transaction (`submit(..., conn=...)`: docs/design.md,
-- "Submitting inside the caller's transaction"). No submitting process decomposes such a run:
-- `deferred_at` (when it was recorded) marks it as waiting for a decomposer, and the first
-- worker or sweeper that sees it after the commit takes it by clearing the mark (one guarded
-- UPDATE, so one of them wins) and decomposes it at once, without the grace that protects a
-- slow original submitter. NULL for every other run. A nullable column: no table rewrite.
ALTER TABLE wl_runs ADD COLUMN deferred_at timestamptz;
-- Workers look for such runs every second when idle: only the marked rows are in this index.
CREATE INDEX wl_runs_deferred ON wl_runs (id) WHERE deferred_at IS NOT NULL;
