-- 0002: per-stage state counts, kept by the same transactions that move items.
-- wl_stage_counts holds, for every run, what
--   SELECT run_id, stage, state, count(*) FROM wl_items GROUP BY run_id, stage, state
-- would return, so `status` reads a few rows instead of counting a million. Like wl_runs'
-- counters it is a projection: the items are the authority, and `reconcile` compares the two
-- and repairs this table. Rows are never deleted by the hot path; n may reach 0.
CREATE TABLE wl_stage_counts (
    id     INTEGER PRIMARY KEY,  -- creation order: stages list in the order they first appear
    run_id INTEGER NOT NULL,
    stage  TEXT    NOT NULL,
    state  TEXT    NOT NULL,
    n      INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT wl_stage_counts_run_id_stage_state_key UNIQUE (run_id, stage, state)
);

INSERT INTO wl_stage_counts (run_id, stage, state, n)
SELECT run_id, stage, state, count(*) FROM wl_items
GROUP BY run_id, stage, state ORDER BY run_id, min(id), state;

-- Retries waiting for their not_before, per run: status asks "are all open items waiting?"
-- without walking the run's pending rows.
CREATE INDEX wl_items_waiting ON wl_items (run_id, not_before)
    WHERE state = 'pending' AND not_before IS NOT NULL;
