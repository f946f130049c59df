-- 0015: a run's priority (docs/design.md, "Claim order"), a whole number from -1000 to 1000,
-- 0 for every run before it: a claimable item of a higher-priority run is claimed before any of
-- a lower one. wl_runs_priority finds the highest open priority from its end, so a worker
-- learns of a higher run at its next claim in one index step however many runs are open.
ALTER TABLE wl_runs ADD COLUMN priority integer NOT NULL DEFAULT 0
    CHECK (priority BETWEEN -1000 AND 1000);
CREATE INDEX wl_runs_priority ON wl_runs (priority, id) WHERE completed_at IS NULL;
