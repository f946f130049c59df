-- 0005: cluster-wide limits of a stage (@job.stage(rate_limit="50/s", max_in_flight=K)).
-- One row per limited (job, stage): a token bucket, read and spent in the claim transaction
-- (one writer at a time: BEGIN IMMEDIATE), so every worker spends from the same bucket. The
-- limits themselves are declared in code; rate, burst and max_in_flight are written here by
-- the claims that spend, so an operator can read what is in force.
CREATE TABLE wl_stage_limits (
    job           TEXT    NOT NULL,
    stage         TEXT    NOT NULL,
    tokens        REAL    NOT NULL,  -- the bucket at refreshed_at, at most burst
    refreshed_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    rate          REAL,              -- tokens a second; NULL: no rate, a cap only
    burst         REAL    NOT NULL,
    max_in_flight INTEGER,           -- NULL: no cap
    PRIMARY KEY (job, stage)
);

-- A limited job is claimed stage by stage: each stage's pending rows in id order, so that a
-- stage held back by its bucket never stands in front of another stage's work.
CREATE INDEX wl_items_stage_claimable ON wl_items (run_id, stage, id) WHERE state = 'pending';

-- A cap counts the claimed items of the stage over the job's open runs (wl_stage_counts).
CREATE INDEX wl_runs_open ON wl_runs (job) WHERE completed_at IS NULL;
