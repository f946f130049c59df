-- 0005: cluster-wide limits of a stage (@job.stage(rate_limit="50/s", max_in_flight=K)).
-- One row per limited (job, stage): a token bucket, taken under its row lock (FOR UPDATE) in
-- the claim transaction before any item row, so every worker on every machine spends from the
-- same bucket. The limits themselves are declared in code; rate, burst and max_in_flight are
-- written here by the claims that spend, so an operator can read what is in force.
CREATE TABLE wl_stage_limits (
    job           text             NOT NULL,
    stage         text             NOT NULL,
    tokens        double precision NOT NULL,  -- the bucket at refreshed_at, at most burst
    refreshed_at  timestamptz      NOT NULL DEFAULT now(),
    rate          double precision,           -- tokens a second; NULL: no rate, a cap only
    burst         double precision NOT NULL,
    max_in_flight bigint,                     -- NULL: no cap
    PRIMARY KEY (job, stage)
);

-- A limited job is claimed stage by stage: each stage's pending rows in id order, so that a
-- stage held back by its bucket never stands in front of another stage's work.
CREATE INDEX wl_items_stage_claimable ON wl_items (run_id, stage, id) WHERE state = 'pending';

-- A cap counts the claimed items of the stage over the job's open runs (wl_stage_counts).
CREATE INDEX wl_runs_open ON wl_runs (job) WHERE completed_at IS NULL;
