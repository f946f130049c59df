-- 0014: runs on a calendar, and deadlines (docs/design.md, "Schedules and deadlines").
-- wl_schedules: one row per declared schedule (its name is unique per ledger). `next_fire_at`
-- is the next planned firing not yet recorded: a sweeper fires a schedule only by moving it
-- from the value it read (a compare-and-set in the firing's own transaction), so two sweepers
-- never record one firing twice. `waiting_fire_at`: overlap="wait", the one firing waiting for
-- the schedule's open run to complete. `missed`: firings passed over (outside the catch-up
-- window, or not wanted by its catch-up rule). `paused_at`/`paused_by`: set while paused.
CREATE TABLE wl_schedules (
    name            TEXT PRIMARY KEY,
    job             TEXT NOT NULL,
    spec            TEXT NOT NULL,
    tz              TEXT NOT NULL,
    next_fire_at    timestamptz,
    waiting_fire_at timestamptz,
    missed          integer NOT NULL DEFAULT 0,
    paused_at       timestamptz,
    paused_by       TEXT,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
-- wl_firings: one row per recorded firing of a schedule, at most one per planned time. `state`:
-- submitted (run_id: the run it made, or the run its key already named), skipped (run_id: the
-- open run that blocked it), waiting (overlap="wait"; run_id: the run it waits for), none (the
-- schedule's function returned None) or failed (the function raised: `error`, tried again at
-- later sweeps while within the catch-up window, `attempts` counts the tries).
CREATE TABLE wl_firings (
    schedule    TEXT NOT NULL,
    fire_at     timestamptz NOT NULL,
    state       TEXT NOT NULL,
    run_id      bigint,
    error       TEXT,
    attempts    integer NOT NULL DEFAULT 1,
    actor       TEXT,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, fire_at)
);
-- the runs a schedule made, so an overlap check reads only the job's open runs
CREATE INDEX wl_firings_run ON wl_firings (run_id) WHERE run_id IS NOT NULL;
-- a run's deadline (NULL: none), when its near-deadline warning starts, and when the sweeper
-- recorded that it missed the deadline (one `deadline_missed` event per run)
ALTER TABLE wl_runs ADD COLUMN deadline_at timestamptz;
ALTER TABLE wl_runs ADD COLUMN warn_at timestamptz;
ALTER TABLE wl_runs ADD COLUMN deadline_missed_at timestamptz;
CREATE INDEX wl_runs_deadline ON wl_runs (deadline_at) WHERE deadline_at IS NOT NULL AND completed_at IS NULL;
-- audit lists the firings whose function raised
CREATE INDEX wl_firings_failed ON wl_firings (schedule, fire_at) WHERE state = 'failed';
