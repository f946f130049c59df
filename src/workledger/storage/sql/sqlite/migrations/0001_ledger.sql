-- 0001: the ledger: runs, items, events (docs/design.md, "The public schema").
CREATE TABLE wl_runs (
    id              INTEGER PRIMARY KEY,
    job             TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    decomposed_at   TEXT,
    completed_at    TEXT,
    paused_at       TEXT,
    cancelled_at    TEXT,
    error           TEXT,
    total           INTEGER NOT NULL DEFAULT 0,
    processed       INTEGER NOT NULL DEFAULT 0,
    failed          INTEGER NOT NULL DEFAULT 0,
    skipped         INTEGER NOT NULL DEFAULT 0,
    UNIQUE (job, idempotency_key)
);

-- wl_items.run_id names a wl_runs row. It carries no FOREIGN KEY on purpose: items are only
-- written for a run that exists, a per-row check costs about 30% of decomposition on
-- PostgreSQL, and it would stand in the way of distributing items by run_id later.
CREATE TABLE wl_items (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL,  -- a wl_runs.id (no FOREIGN KEY: see above)
    stage       TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    key         TEXT,
    data        TEXT,
    state       TEXT    NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'claimed', 'processed', 'failed', 'skipped', 'unknown')),
    attempts    INTEGER NOT NULL DEFAULT 0,
    lease_until TEXT,
    not_before  TEXT,
    lease_token INTEGER,
    result      TEXT,
    error       TEXT,
    created_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    updated_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    UNIQUE (run_id, stage, seq)
);

-- The claim walks only pending rows of one run in id order: finished rows are not in this index,
-- so a claim stays O(chunk) however many rows have finished.
CREATE INDEX wl_items_claimable ON wl_items (run_id, id) WHERE state = 'pending';
CREATE INDEX wl_items_leased ON wl_items (lease_until) WHERE state = 'claimed';
-- What needs a person (audit): failed and unknown items, without scanning finished rows.
CREATE INDEX wl_items_attention ON wl_items (state, id) WHERE state IN ('failed', 'unknown');

CREATE TABLE wl_events (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL,
    item_id     INTEGER,
    at          TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    kind        TEXT    NOT NULL,
    lease_token INTEGER,
    actor       TEXT,
    detail      TEXT
);
CREATE INDEX wl_events_run_item ON wl_events (run_id, item_id);

-- SQLite has no sequences: fencing tokens come from this counter, bumped under BEGIN IMMEDIATE.
CREATE TABLE wl_sequences (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO wl_sequences (name, value) VALUES ('lease_token', 0);
