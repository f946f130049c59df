-- 0015: a run's priority (docs/design.md, "Claim order"), a whole number from -1000 to 1000,
-- 0 for every run before it: a claimable item of a higher-priority run is claimed before any of
-- a lower one. wl_runs_claimable holds exactly the runs runs_claimable lists, by job and
-- priority, so that the highest claimable priority of a job is one index step (a worker asks
-- before every claim) however many runs are open, paused or of other jobs.
ALTER TABLE wl_runs ADD COLUMN priority integer NOT NULL DEFAULT 0
    CHECK (priority BETWEEN -1000 AND 1000);
CREATE INDEX wl_runs_claimable ON wl_runs (job, priority, id)
    WHERE decomposed_at IS NOT NULL AND completed_at IS NULL
      AND paused_at IS NULL AND cancelled_at IS NULL;
