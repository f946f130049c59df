-- SQLite queries. All but lease_token_peek/next exist in ../postgres/queries.sql too (tests check it).
-- Times are UTC text 'YYYY-MM-DD HH:MM:SS.SSS', computed by the database.
-- A '-- moves:' line lists every change of wl_items.state its statement can make; a test
-- derives the literal ones from the SQL and checks all against core/states.py MOVES.

-- name: run_insert
INSERT INTO wl_runs (job, idempotency_key, payload, tolerate, priority, tenant, closing)
VALUES (:job, :key, :payload, :tolerate, :priority, :tenant, :closing)
ON CONFLICT (job, idempotency_key) DO NOTHING
RETURNING id;

-- name: runs_insert_many
-- submit_many's run rows in one statement: rows [job, key, payload, tolerate, priority,
-- tenant, closing]; a key that names a run already inserts nothing (RETURNING: the new ones only).
INSERT INTO wl_runs (job, idempotency_key, payload, tolerate, priority, tenant, closing)
SELECT json_extract(r.value, '$[0]'), json_extract(r.value, '$[1]'),
       json_extract(r.value, '$[2]'), json_extract(r.value, '$[3]'),
       json_extract(r.value, '$[4]'), json_extract(r.value, '$[5]'),
       json_extract(r.value, '$[6]')
FROM json_each(:rows) AS r WHERE true
ON CONFLICT (job, idempotency_key) DO NOTHING
RETURNING id, idempotency_key;

-- name: runs_mark_new
-- submit_many's mark of the runs it has just recorded with all their items, in one statement:
-- rows [run_id, total, skipped], counted from the rows it wrote (run_mark_decomposed recounts
-- from the stage counts instead); a run of only skipped items (or of none) is complete.
UPDATE wl_runs SET
    decomposed_at = strftime('%Y-%m-%d %H:%M:%f', 'now'),
    total = json_extract(u.value, '$[1]'),
    skipped = json_extract(u.value, '$[2]'),
    completed_at = CASE WHEN json_extract(u.value, '$[1]') = json_extract(u.value, '$[2]')
                        THEN strftime('%Y-%m-%d %H:%M:%f', 'now') END
FROM json_each(:rows) AS u
WHERE wl_runs.id = json_extract(u.value, '$[0]')
RETURNING id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
          paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant;

-- name: events_submitted_many
-- submit_many's `submitted` event of every run it has just inserted, built by the database
-- from the rows themselves (the runs exist: this transaction wrote them).
INSERT INTO wl_events (run_id, kind, detail)
SELECT r.id, 'submitted', json_object('key', r.idempotency_key) FROM wl_runs AS r
WHERE r.id IN (SELECT value FROM json_each(:run_ids)) ORDER BY r.id;

-- name: events_decomposed_many
-- submit_many's `decomposed` event of every run it has just marked, with its total.
INSERT INTO wl_events (run_id, kind, detail)
SELECT r.id, 'decomposed', json_object('total', r.total) FROM wl_runs AS r
WHERE r.id IN (SELECT value FROM json_each(:run_ids)) ORDER BY r.id;

-- name: run_by_key
SELECT * FROM wl_runs WHERE job = :job AND idempotency_key = :key;

-- name: run_get
-- Every column but the payload, which can be large and no reader shows: run_payload reads it.
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs WHERE id = :run_id;

-- name: run_payload
SELECT payload FROM wl_runs WHERE id = :run_id;

-- name: runs_list
-- Newest first, below an id to page back; without payloads (see run_get).
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs WHERE (:before IS NULL OR id < :before)
  AND (:tenant IS NULL OR tenant = :tenant OR (:tenant = 'default' AND tenant IS NULL))
ORDER BY id DESC LIMIT :limit;

-- name: runs_count
SELECT count(*) FROM wl_runs WHERE (:before IS NULL OR id < :before)
  AND (:tenant IS NULL OR tenant = :tenant OR (:tenant = 'default' AND tenant IS NULL));

-- name: run_mark_decomposed
UPDATE wl_runs SET
    decomposed_at = COALESCE(decomposed_at, strftime('%Y-%m-%d %H:%M:%f', 'now')),
    error = NULL,
    total = (SELECT COALESCE(sum(n), 0) FROM wl_stage_counts
             WHERE run_id = :run_id AND stage = :stage),
    skipped = (SELECT COALESCE(sum(n), 0) FROM wl_stage_counts
               WHERE run_id = :run_id AND state = 'skipped'),
    completed_at = CASE
        WHEN NOT EXISTS (SELECT 1 FROM wl_stage_counts WHERE run_id = :run_id AND n > 0
                         AND state NOT IN ('processed', 'failed', 'skipped'))
        THEN COALESCE(completed_at, strftime('%Y-%m-%d %H:%M:%f', 'now')) END
WHERE id = :run_id
RETURNING id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
          paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant;

-- name: run_record_error
UPDATE wl_runs SET error = :error WHERE id = :run_id;

-- name: runs_claimable
-- The claim order (docs/design.md, "Claim order"): higher priorities first, then oldest first;
-- each run with its tenant's weight (1 without a row in wl_tenants).
SELECT r.id, r.job, r.priority, r.tenant, COALESCE(t.weight, 1) FROM wl_runs AS r
LEFT JOIN wl_tenants AS t ON t.name = COALESCE(r.tenant, 'default')
WHERE r.decomposed_at IS NOT NULL AND r.completed_at IS NULL
  AND r.paused_at IS NULL AND r.cancelled_at IS NULL
  AND r.job IN (SELECT value FROM json_each(:jobs))
ORDER BY r.priority DESC, r.id;

-- name: runs_top_priority
-- The highest priority among the runs runs_claimable lists: per job, one step at the end of
-- wl_runs_claimable (a worker asks before every claim, so never a walk over the open runs).
SELECT max((SELECT r.priority FROM wl_runs AS r INDEXED BY wl_runs_claimable
            WHERE r.job = j.value AND r.decomposed_at IS NOT NULL AND r.completed_at IS NULL
              AND r.paused_at IS NULL AND r.cancelled_at IS NULL
            ORDER BY r.priority DESC LIMIT 1))
FROM json_each(:jobs) AS j;

-- name: run_priority
-- An open run's priority before set_priority changes it (the write transaction holds the file).
SELECT priority FROM wl_runs WHERE id = :run_id AND completed_at IS NULL;

-- name: run_set_priority
UPDATE wl_runs SET priority = :priority WHERE id = :run_id AND completed_at IS NULL;

-- name: tenant_weight
-- A tenant's weight before tenant_set_weight changes it (the write transaction holds the file).
SELECT weight FROM wl_tenants WHERE name = :name;

-- name: tenant_set_weight
INSERT INTO wl_tenants (name, weight, updated_by, note) VALUES (:name, :weight, :actor, :note)
ON CONFLICT (name) DO UPDATE SET weight = excluded.weight, updated_by = excluded.updated_by,
    note = excluded.note, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now');

-- name: tenants_list
SELECT name, weight, updated_at, updated_by, note FROM wl_tenants ORDER BY name;

-- name: tenant_open_runs
SELECT count(*) FROM wl_runs
WHERE completed_at IS NULL
  AND (tenant = :tenant OR (:tenant = 'default' AND tenant IS NULL));

-- name: run_counts
-- The projection: a few rows per run, however many items it has. Stages in the order they first
-- appeared (the first row of each stage, counting rows whose n has dropped to 0).
SELECT stage, state, n FROM (
    SELECT stage, state, n, id, min(id) OVER (PARTITION BY stage) AS first
    FROM wl_stage_counts WHERE run_id = :run_id) AS c
WHERE n <> 0
ORDER BY first, id;

-- name: run_counts_compare
-- Reconcile: the items' counts (the authority) and the stored ones, read in one statement so
-- both come from one snapshot.
SELECT 'ledger' AS side, stage, state, count(*) AS n, min(id) AS first
FROM wl_items WHERE run_id = :run_id GROUP BY stage, state
UNION ALL
SELECT 'stored', stage, state, n, first FROM (
    SELECT stage, state, n, id, min(id) OVER (PARTITION BY stage) AS first
    FROM wl_stage_counts WHERE run_id = :run_id) AS c
WHERE n <> 0
ORDER BY 1, 5, 2, 3;

-- name: counts_lock
-- Reconcile holds the run's counters, in the order every writer takes them, while it compares.
SELECT stage, state FROM wl_stage_counts WHERE run_id = :run_id
ORDER BY stage, state;

-- name: counts_add
-- One row per (stage, state) a transaction moved, in sorted order, as its last statement.
INSERT INTO wl_stage_counts (run_id, stage, state, n) VALUES (?, ?, ?, ?)
ON CONFLICT (run_id, stage, state) DO UPDATE SET n = wl_stage_counts.n + excluded.n;

-- name: run_waits
-- Expired leases, retries not yet due and unknown items awaiting their verify hook, for status:
-- each walks a small partial index.
SELECT
    (SELECT count(*) FROM wl_items INDEXED BY wl_items_leased
     WHERE state = 'claimed' AND lease_until < now.t AND run_id = :run_id),
    (SELECT count(*) FROM wl_items INDEXED BY wl_items_waiting
     WHERE run_id = :run_id AND state = 'pending' AND not_before IS NOT NULL
       AND not_before > now.t AND updated_at <= now.t),
    (SELECT count(*) FROM wl_items INDEXED BY wl_items_attention
     WHERE state IN ('failed', 'unknown') AND state = 'unknown' AND run_id = :run_id
       AND error = :verify)
FROM (SELECT strftime('%Y-%m-%d %H:%M:%f', 'now') AS t) AS now;

-- name: run_add_units
-- total: rows a decomposition batch wrote (0 for every other write; the mark recounts).
UPDATE wl_runs SET
    total = total + :total,
    processed = processed + :processed,
    failed = failed + :failed,
    skipped = skipped + :skipped,
    completed_at = CASE
        WHEN decomposed_at IS NOT NULL
             AND processed + :processed + failed + :failed + skipped + :skipped
                 >= total + :total
        THEN COALESCE(completed_at, strftime('%Y-%m-%d %H:%M:%f', 'now')) END
WHERE id = :run_id
RETURNING cancelled_at;

-- name: runs_lock
-- Before runs_add_units: nothing to take on SQLite (one writer at a time already); the name
-- is the PostgreSQL statement's, which locks the run rows in id order.
SELECT id FROM wl_runs WHERE id IN (SELECT value FROM json_each(:run_ids));

-- name: runs_add_units
-- run_add_units for the runs of a chunk claimed across runs, in one statement: rows
-- [run_id, processed, failed, skipped], one per run; total is not moved (a finish adds none).
UPDATE wl_runs SET
    processed = processed + json_extract(u.value, '$[1]'),
    failed = failed + json_extract(u.value, '$[2]'),
    skipped = skipped + json_extract(u.value, '$[3]'),
    completed_at = CASE
        WHEN decomposed_at IS NOT NULL
             AND processed + json_extract(u.value, '$[1]') + failed
                 + json_extract(u.value, '$[2]') + skipped + json_extract(u.value, '$[3]')
                 >= total
        THEN COALESCE(completed_at, strftime('%Y-%m-%d %H:%M:%f', 'now')) END
FROM json_each(:rows) AS u
WHERE wl_runs.id = json_extract(u.value, '$[0]')
RETURNING id, cancelled_at;

-- name: items_insert
-- moves: (none) -> pending, skipped
-- positional parameters (run_id, stage, seq, key, data, state, error, concurrency_key): tuples are cheaper
-- than dicts when a decomposition writes millions of rows
INSERT INTO wl_items (run_id, stage, seq, key, data, state, error, concurrency_key)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, stage, seq) DO NOTHING;

-- name: items_insert_runs
-- moves: (none) -> pending, skipped
-- items_insert for the items of several runs recorded by one submit_many: the same positional
-- rows, each naming its run, sent with executemany in the one transaction.
INSERT INTO wl_items (run_id, stage, seq, key, data, state, error, concurrency_key)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, stage, seq) DO NOTHING;

-- name: lease_token_peek
-- SQLite only: without sequences or writing CTEs the claim reads its token in a statement of its
-- own (PostgreSQL's items_claim takes it from wl_lease_token_seq itself), and takes it with
-- lease_token_next only when it claimed something: a claim that finds nothing writes nothing,
-- so an idle worker costs the disk nothing. One writer at a time (BEGIN IMMEDIATE) makes the
-- read and the write one step.
SELECT value + 1 FROM wl_sequences WHERE name = 'lease_token';

-- name: lease_token_next
UPDATE wl_sequences SET value = value + 1 WHERE name = 'lease_token' RETURNING value;

-- name: items_claim
-- moves: pending -> claimed
UPDATE wl_items SET
    state = 'claimed',
    started_at = NULL,
    -- a retry's backoff is served once it is claimed: a release or a reclaim
    -- makes it due at once (a time written by a clock ahead would stay)
    not_before = NULL,
    held_until = NULL,  -- a broker's hold ends with any claim (0013)
    lease_token = :token,
    holder = :holder,
    lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', :lease),
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (
    SELECT id FROM wl_items INDEXED BY wl_items_claimable
    WHERE run_id = :run_id AND state = 'pending' AND id > :after_id
      -- due, or written by a clock ahead of this one (updated_at, same statement):
      AND (not_before IS NULL OR not_before <= strftime('%Y-%m-%d %H:%M:%f', 'now')
           OR updated_at > strftime('%Y-%m-%d %H:%M:%f', 'now'))
      -- the closing entry is the sweeper's to claim (closing = 1), never a worker's
      AND (stage = '@close') = :closing
    ORDER BY id LIMIT :limit)
  AND EXISTS (SELECT 1 FROM wl_runs r WHERE r.id = :run_id AND r.decomposed_at IS NOT NULL
              AND r.paused_at IS NULL AND r.cancelled_at IS NULL)
RETURNING id, run_id, stage, seq, key, data, attempts, lease_token, error;

-- name: items_claim_runs
-- moves: pending -> claimed
-- A claim across runs (ClaimParams.run_ids, issue 25): the pending items of several runs of one
-- job (the first run's) in one statement, run by run in id order, each through
-- wl_items_claimable: O(limit + runs listed) however big the runs are. A run paused,
-- cancelled, not yet decomposed or of another job gives nothing; the closing entry never.
UPDATE wl_items SET
    state = 'claimed',
    started_at = NULL,
    not_before = NULL,  -- a retry's backoff is served once it is claimed (items_claim)
    held_until = NULL,  -- a broker's hold ends with any claim (0013)
    lease_token = :token,
    holder = :holder,
    lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', :lease),
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (
    SELECT id FROM wl_items INDEXED BY wl_items_claimable
    -- the runs through their primary key (CROSS JOIN: never a walk of the job's runs)
    WHERE run_id IN (
        SELECT r.id FROM json_each(:run_ids) AS j CROSS JOIN wl_runs AS r ON r.id = j.value
        WHERE r.job = (SELECT job FROM wl_runs WHERE id = :run_id)
          AND r.decomposed_at IS NOT NULL AND r.paused_at IS NULL AND r.cancelled_at IS NULL)
      AND state = 'pending' AND stage <> '@close'
      -- due, or written by a clock ahead of this one (updated_at, same statement):
      AND (not_before IS NULL OR not_before <= strftime('%Y-%m-%d %H:%M:%f', 'now')
           OR updated_at > strftime('%Y-%m-%d %H:%M:%f', 'now'))
    ORDER BY run_id, id LIMIT :limit)
RETURNING id, run_id, stage, seq, key, data, attempts, lease_token, error;

-- name: items_claim_stage
-- moves: pending -> claimed
-- A limited job's claim, one stage at a time (ClaimParams.stages), each through
-- wl_items_stage_claimable so that it stays O(limit) however the stages' rows interleave. The
-- statements of one claim share the token read by lease_token_peek.
UPDATE wl_items SET
    state = 'claimed',
    started_at = NULL,
    -- a retry's backoff is served once it is claimed: a release or a reclaim
    -- makes it due at once (a time written by a clock ahead would stay)
    not_before = NULL,
    held_until = NULL,  -- a broker's hold ends with any claim (0013)
    lease_token = :token,
    holder = :holder,
    lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', :lease),
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (
    SELECT id FROM wl_items INDEXED BY wl_items_stage_claimable
    WHERE run_id = :run_id AND stage = :stage AND state = 'pending'
      -- due, or written by a clock ahead of this one (updated_at, same statement):
      AND (not_before IS NULL OR not_before <= strftime('%Y-%m-%d %H:%M:%f', 'now')
           OR updated_at > strftime('%Y-%m-%d %H:%M:%f', 'now'))
    ORDER BY id LIMIT :limit)
  AND EXISTS (SELECT 1 FROM wl_runs r WHERE r.id = :run_id AND r.decomposed_at IS NOT NULL
              AND r.paused_at IS NULL AND r.cancelled_at IS NULL)
RETURNING id, run_id, stage, seq, key, data, attempts, lease_token, error;

-- name: keys_in_flight
-- A stage with max_per_key (0017): how many items of each concurrency key the job's runs have
-- claimed now, counted from the rows themselves through wl_items_keyed_claimed (one entry per
-- keyed item in flight). Read in the claim's write transaction: one claimer at a time.
SELECT i.concurrency_key, count(*) FROM wl_items AS i
JOIN wl_runs AS r ON r.id = i.run_id
WHERE i.state = 'claimed' AND i.concurrency_key IS NOT NULL AND i.stage = :stage
  AND r.job = :job
GROUP BY i.concurrency_key;

-- name: items_keyed_pending
-- The pending, due rows of one run's stage a keyed claim chooses from (core/rates.py
-- pick_by_key), in id order, the keys already full left out before the window is cut.
SELECT id, concurrency_key FROM wl_items INDEXED BY wl_items_stage_claimable
WHERE run_id = :run_id AND stage = :stage AND state = 'pending'
  AND (not_before IS NULL OR not_before <= strftime('%Y-%m-%d %H:%M:%f', 'now')
       OR updated_at > strftime('%Y-%m-%d %H:%M:%f', 'now'))
  AND (concurrency_key IS NULL OR concurrency_key NOT IN (SELECT value FROM json_each(:full)))
ORDER BY id LIMIT :limit;

-- name: items_keyed_named
-- A broker task's claim of a stage with max_per_key: the named rows still pending, with their
-- keys, found by identity, in id order (pick_by_key then chooses what the keys allow).
SELECT id, seq, concurrency_key FROM wl_items INDEXED BY sqlite_autoindex_wl_items_1
WHERE run_id = :run_id AND stage = :stage AND seq IN (SELECT value FROM json_each(:seqs))
  AND state = 'pending'
ORDER BY id;

-- name: items_claim_ids
-- moves: pending -> claimed
-- A keyed claim's chosen rows, still pending, of a run that may be claimed from; the token is
-- the one the claim's other statements share (lease_token_peek).
UPDATE wl_items SET
    state = 'claimed',
    started_at = NULL,
    not_before = NULL,
    held_until = NULL,
    lease_token = :token,
    holder = :holder,
    lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', :lease),
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (SELECT value FROM json_each(:ids)) AND run_id = :run_id AND state = 'pending'
  AND EXISTS (SELECT 1 FROM wl_runs r WHERE r.id = :run_id AND r.decomposed_at IS NOT NULL
              AND r.paused_at IS NULL AND r.cancelled_at IS NULL)
RETURNING id, run_id, stage, seq, key, data, attempts, lease_token, error;

-- name: limit_lock
-- A limited stage's bucket, read in the claim transaction (BEGIN IMMEDIATE: one claimer at a
-- time), with the database's clock.
SELECT tokens, (julianday('now') - julianday(refreshed_at)) * 86400.0 AS elapsed
FROM wl_stage_limits WHERE job = :job AND stage = :stage;

-- name: limit_create
-- The first claim of a limited stage makes its bucket, full.
INSERT INTO wl_stage_limits (job, stage, tokens, rate, burst, max_in_flight)
VALUES (:job, :stage, :burst, :rate, :burst, :max_in_flight)
ON CONFLICT (job, stage) DO NOTHING;

-- name: limit_spend
-- What is left of the bucket after a claim that took items; a claim that took none writes
-- nothing, so waiting for a token costs the disk nothing. refreshed_at is read now, after the
-- claim: refill is counted from later than the tokens were, never from earlier.
UPDATE wl_stage_limits SET tokens = :tokens,
    refreshed_at = strftime('%Y-%m-%d %H:%M:%f', 'now'),
    rate = :rate, burst = :burst, max_in_flight = :max_in_flight
WHERE job = :job AND stage = :stage;

-- name: limit_in_flight
-- The stage's claimed items over the job's open runs (a complete run holds none): what a cap
-- counts.
SELECT COALESCE(sum(c.n), 0) FROM wl_stage_counts AS c
WHERE c.stage = :stage AND c.state = 'claimed'
  AND c.run_id IN (SELECT r.id FROM wl_runs AS r INDEXED BY wl_runs_open
                   WHERE r.job = :job AND r.completed_at IS NULL);

-- name: events_add_now
-- events_add, the same as it on SQLite (one writer: the statement's time is the claim's).
INSERT INTO wl_events (run_id, item_id, kind, lease_token, actor, detail)
SELECT :run_id, :item_id, :kind, :lease_token, :actor, :detail
WHERE EXISTS (SELECT 1 FROM wl_runs WHERE id = :run_id);

-- name: items_mark_started
-- Just before a handler runs, where its start must be known (a stage that is not
-- idempotent, see migration 0004); an item run alone after its holder vanished is also
-- charged its attempt here (charge 1), before it starts.
UPDATE wl_items SET attempts = attempts + :charge,
    started_at = strftime('%Y-%m-%d %H:%M:%f', 'now'),
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (SELECT value FROM json_each(:ids)) AND lease_token = :token AND state = 'claimed'
RETURNING id;

-- name: items_heartbeat
UPDATE wl_items SET lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', :lease)
WHERE id IN (SELECT value FROM json_each(:ids)) AND lease_token = :token AND state = 'claimed';

-- name: items_release
-- moves: claimed -> pending
UPDATE wl_items SET state = 'pending', lease_until = NULL,
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (SELECT value FROM json_each(:ids)) AND lease_token = :token AND state = 'claimed'
RETURNING stage;

-- name: items_finish_if_leased
-- moves: claimed -> processed, failed, skipped, pending, unknown
UPDATE wl_items SET
    state = f.state,
    result = f.result,
    error = f.error,
    attempts = wl_items.attempts + f.charge,
    lease_until = NULL,
    not_before = CASE WHEN f.delay IS NULL THEN NULL
                 ELSE strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || f.delay || ' seconds') END,
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token,
             json_extract(value, '$[2]') AS state, json_extract(value, '$[3]') AS result,
             json_extract(value, '$[4]') AS error, json_extract(value, '$[5]') AS delay,
             json_extract(value, '$[6]') AS charge
      FROM json_each(:rows)) AS f
WHERE wl_items.id = f.id AND wl_items.lease_token = f.token AND wl_items.state = 'claimed'
RETURNING wl_items.id, wl_items.stage;

-- name: items_finish_group
-- moves: claimed -> processed, failed, skipped, pending, unknown
-- The same fenced completion for items that share one outcome (most chunks): an id list and
-- one value per column, instead of a value per column per row.
UPDATE wl_items SET
    state = :state,
    result = :result,
    error = :error,
    attempts = attempts + :charge,
    lease_until = NULL,
    not_before = CASE WHEN :delay IS NULL THEN NULL
                 ELSE strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || :delay || ' seconds') END,
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (SELECT value FROM json_each(:ids)) AND lease_token = :token AND state = 'claimed'
RETURNING id, stage;

-- name: items_handoff
-- moves: (none) -> pending
-- redispatch_at is copied: a hand-off row is owed a message as its previous row was (0007);
-- so is the concurrency key: a unit's later stages keep its first stage's (0017)
INSERT INTO wl_items (run_id, stage, seq, key, data, redispatch_at, concurrency_key)
SELECT i.run_id, json_extract(h.value, '$[1]'), i.seq, i.key, i.data, i.redispatch_at,
       i.concurrency_key
FROM json_each(:rows) AS h JOIN wl_items AS i ON i.id = json_extract(h.value, '$[0]')
WHERE true
ON CONFLICT (run_id, stage, seq) DO NOTHING
RETURNING run_id, stage;

-- name: items_list
SELECT * FROM wl_items
WHERE run_id = :run_id AND id > :after_id
  AND (:stage IS NULL OR stage = :stage) AND (:state IS NULL OR state = :state)
  AND (:seq IS NULL OR seq = :seq)
ORDER BY id LIMIT :limit;

-- name: items_count
-- How many more items_list would find after an id: what a listing cut short says.
SELECT count(*) FROM wl_items
WHERE run_id = :run_id AND id > :after_id
  AND (:stage IS NULL OR stage = :stage) AND (:state IS NULL OR state = :state);

-- name: leases_reclaim_expired
-- moves: claimed -> pending, unknown
-- Taken back (migration 0008): an item whose lease ran out by the clock and that has no holder,
-- or whose holder is not known alive (its file missing: its time decides); and at once an item
-- whose holder is proven gone (:dead, its file found unlocked). Never one whose holder is alive
-- (:alive), whatever the clocks say; nothing with a holder when the holders could not be told.
UPDATE wl_items SET
    -- an item whose handler never started under this claim cannot have had an effect
    state = CASE WHEN started_at IS NULL THEN 'pending' ELSE :to_state END,
    error = CASE WHEN started_at IS NULL AND :to_state <> 'pending' THEN :unstarted
            -- a suspect of an idempotent stage: lost again while started, it runs alone next
            -- time; not started under this claim, it stays what it was
            WHEN :to_state = 'pending' AND error LIKE 'lease_expired%'
            THEN CASE WHEN started_at IS NULL THEN error ELSE :again END
            ELSE :reason END,
    lease_until = NULL,
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (
    SELECT id FROM (
        SELECT i.id FROM wl_items AS i INDEXED BY wl_items_leased
        JOIN wl_runs AS r ON r.id = i.run_id
        WHERE i.state = 'claimed' AND i.lease_until < strftime('%Y-%m-%d %H:%M:%f', 'now')
          AND (i.holder IS NULL
               OR (:told AND i.holder NOT IN (SELECT value FROM json_each(:alive))))
          AND r.job = :job AND i.stage = :stage
        UNION
        SELECT i.id FROM wl_items AS i INDEXED BY wl_items_leased
        JOIN wl_runs AS r ON r.id = i.run_id
        WHERE :any_dead AND i.state = 'claimed'
          AND i.holder IN (SELECT value FROM json_each(:dead))
          AND r.job = :job AND i.stage = :stage)
    LIMIT :limit)
RETURNING *;

-- name: outlook
SELECT
    sum(CASE WHEN state = 'pending' AND (not_before IS NULL OR not_before <= now.t
                                         OR updated_at > now.t) THEN 1 ELSE 0 END),
    sum(CASE WHEN state = 'pending' AND not_before > now.t AND updated_at <= now.t
        THEN 1 ELSE 0 END),
    min(CASE WHEN state = 'pending' AND not_before > now.t AND updated_at <= now.t
        THEN (julianday(not_before) - julianday(now.t)) * 86400.0 END),
    sum(CASE WHEN state = 'claimed' AND lease_until >= now.t THEN 1 ELSE 0 END),
    min(CASE WHEN state = 'claimed' AND lease_until >= now.t
        THEN (julianday(lease_until) - julianday(now.t)) * 86400.0 END),
    sum(CASE WHEN state = 'claimed' AND lease_until < now.t THEN 1 ELSE 0 END)
FROM wl_items, (SELECT strftime('%Y-%m-%d %H:%M:%f', 'now') AS t) AS now
WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND state IN ('pending', 'claimed');

-- name: events_add
-- Only while the run exists: a write that arrives after its run was pruned (a stale finish,
-- an ack, a sweeper's note) would leave an event nothing ever removes. One writer: the check
-- and the insert see the same ledger.
INSERT INTO wl_events (run_id, item_id, kind, lease_token, actor, detail)
SELECT :run_id, :item_id, :kind, :lease_token, :actor, :detail
WHERE EXISTS (SELECT 1 FROM wl_runs WHERE id = :run_id);

-- name: events_list
SELECT * FROM wl_events
WHERE run_id = :run_id AND (:item_id IS NULL OR item_id = :item_id)
  AND (:kind IS NULL OR kind = :kind)
ORDER BY id;

-- name: items_settle
-- moves: unknown -> processed, failed, pending, unknown; failed -> pending
UPDATE wl_items SET
    state = f.state,
    result = COALESCE(f.result, wl_items.result),
    error = f.error,
    attempts = CASE WHEN f.reset THEN 0 ELSE wl_items.attempts END,
    lease_until = NULL,
    not_before = CASE WHEN f.delay IS NULL THEN NULL
                 ELSE strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || f.delay || ' seconds') END,
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS state,
             json_extract(value, '$[2]') AS result, json_extract(value, '$[3]') AS error,
             json_extract(value, '$[4]') AS delay, json_extract(value, '$[5]') AS reset
      FROM json_each(:rows)) AS f
WHERE wl_items.id = f.id AND wl_items.state = :from_state AND wl_items.run_id = :run_id
RETURNING wl_items.id, wl_items.stage;

-- name: items_keys
SELECT seq, key FROM wl_items
WHERE run_id = :run_id AND stage = :stage AND seq >= :lo AND seq < :hi;

-- name: items_attention
SELECT * FROM wl_items INDEXED BY wl_items_attention
WHERE state IN ('failed', 'unknown') AND state IN (SELECT value FROM json_each(:states))
  AND id > :after_id
ORDER BY id LIMIT :limit;

-- name: leases_expired
-- What leases_reclaim_expired would take back (run out without a live holder, or its holder
-- proven gone).
SELECT * FROM wl_items INDEXED BY wl_items_leased
WHERE state = 'claimed'
  AND ((lease_until < strftime('%Y-%m-%d %H:%M:%f', 'now')
        AND (holder IS NULL OR (:told AND holder NOT IN (SELECT value FROM json_each(:alive)))))
       OR (:any_dead AND holder IN (SELECT value FROM json_each(:dead))))
  AND id > :after_id
ORDER BY id LIMIT :limit;

-- name: audit_attention
-- The failed and unknown items an audit lists: of one run, of one job's runs, changed since.
SELECT * FROM wl_items INDEXED BY wl_items_attention
WHERE state IN ('failed', 'unknown')
  AND (:run_id IS NULL OR run_id = :run_id)
  AND (:job IS NULL OR run_id IN (SELECT id FROM wl_runs WHERE job = :job))
  AND (:since IS NULL OR updated_at >= :since)
  AND id > :after_id
ORDER BY id LIMIT :limit;

-- name: audit_expired
-- The claimed items whose lease ran out that an audit lists, filtered as audit_attention.
SELECT * FROM wl_items INDEXED BY wl_items_leased
WHERE state = 'claimed' AND lease_until < strftime('%Y-%m-%d %H:%M:%f', 'now')
  AND (:run_id IS NULL OR run_id = :run_id)
  AND (:job IS NULL OR run_id IN (SELECT id FROM wl_runs WHERE job = :job))
  AND (:since IS NULL OR lease_until >= :since)
  AND id > :after_id
ORDER BY id LIMIT :limit;

-- name: runs_undecomposed
-- No new row for `grace` seconds (inclusive: grace 0 includes a run created this millisecond).
-- With a backoff, a run whose decomposer failed n times waits backoff * 2^(n-1) seconds (at
-- most an hour) after its last failure, so a broken decomposer is not retried every pass.
SELECT r.id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs AS r
WHERE decomposed_at IS NULL AND cancelled_at IS NULL
  AND r.deferred_at IS NULL  -- runs_deferred's: taken at once, not after a grace
  AND COALESCE((SELECT max(created_at) FROM wl_items WHERE run_id = r.id), r.created_at)
      <= strftime('%Y-%m-%d %H:%M:%f', 'now', :grace)
  AND (:backoff <= 0 OR r.error IS NULL OR COALESCE((
      SELECT max(e.at) <= strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || min(
                 :backoff * (1 << max(min(count(*) - 1, 16), 0)), 3600.0) || ' seconds')
      FROM wl_events AS e WHERE e.run_id = r.id AND e.kind = 'decomposition_failed'), 1))
ORDER BY id;

-- name: run_insert_deferred
-- submit with conn=: the run row, written on the caller's connection in the caller's
-- transaction and marked deferred, so that the first worker or sweeper to see it after the
-- commit takes its decomposition (run_take_deferred).
INSERT INTO wl_runs (job, idempotency_key, payload, tolerate, priority, tenant, closing, deferred_at)
VALUES (:job, :key, :payload, :tolerate, :priority, :tenant, :closing, strftime('%Y-%m-%d %H:%M:%f', 'now'))
ON CONFLICT (job, idempotency_key) DO NOTHING
RETURNING id;

-- name: run_by_key_in
-- run_by_key on the caller's connection, whose JSON decoding is its own: the payload as text.
SELECT id, job, idempotency_key, NULL AS payload, payload AS payload_text, created_at,
       decomposed_at, completed_at, paused_at, cancelled_at, error, total, processed, failed,
       skipped, tolerate, priority, tenant
FROM wl_runs WHERE job = :job AND idempotency_key = :key;

-- name: ledger_identity
-- Which database file a connection is on: the caller's must be on the ledger's.
SELECT file FROM pragma_database_list WHERE name = 'main';

-- name: runs_deferred
-- Deferred runs no decomposer has taken yet, of the given jobs (NULL: of every job, for
-- audit), oldest first, through their own partial index; without payloads.
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs INDEXED BY wl_runs_deferred
WHERE deferred_at IS NOT NULL AND cancelled_at IS NULL
  AND (:jobs IS NULL OR job IN (SELECT value FROM json_each(:jobs)))
ORDER BY id LIMIT :limit;

-- name: run_take_deferred
-- A worker or sweeper takes a deferred run's decomposition: guarded by the mark, so of two
-- takers one gets the row (with its payload) and the other nothing.
UPDATE wl_runs SET deferred_at = NULL
WHERE id = :run_id AND deferred_at IS NOT NULL AND decomposed_at IS NULL
  AND cancelled_at IS NULL
RETURNING *;

-- name: runs_to_close
SELECT r.id FROM wl_runs AS r
WHERE r.completed_at IS NOT NULL AND r.cancelled_at IS NULL AND r.job IN (SELECT value FROM json_each(:jobs))
  AND NOT EXISTS (SELECT 1 FROM wl_items AS i WHERE i.run_id = r.id AND i.stage = :stage
                  AND i.state IN ('processed', 'failed', 'skipped', 'unknown'))
ORDER BY r.id;

-- name: run_pause
UPDATE wl_runs SET paused_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id = :run_id AND paused_at IS NULL AND cancelled_at IS NULL
RETURNING id;

-- name: run_resume
UPDATE wl_runs SET paused_at = NULL WHERE id = :run_id AND paused_at IS NOT NULL
RETURNING id;

-- name: run_cancel
UPDATE wl_runs SET cancelled_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id = :run_id AND cancelled_at IS NULL
RETURNING id;

-- name: items_pending_history
-- Before a cancel skips a run's pending items: those with a reason or attempts, whose previous
-- values the cancel's events keep.
SELECT id, stage, error, attempts FROM wl_items
WHERE run_id = :run_id AND state = 'pending' AND (error IS NOT NULL OR attempts > 0)
ORDER BY id;

-- name: items_cancel_pending
-- moves: pending -> skipped
UPDATE wl_items SET state = 'skipped', error = 'cancelled',
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE run_id = :run_id AND state = 'pending'
RETURNING id, stage;

-- name: run_lock
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs WHERE id = :run_id;

-- name: run_set_projection
UPDATE wl_runs SET total = :total, processed = :processed, failed = :failed,
    skipped = :skipped,
    completed_at = CASE WHEN :complete THEN COALESCE(completed_at, strftime('%Y-%m-%d %H:%M:%f', 'now'))
                   END
WHERE id = :run_id;

-- Reads for the HTTP layer and metrics, and retention (prune). Listings leave the payload out.

-- name: runs_page
-- A page of runs, newest first, below a keyset cursor.
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs
WHERE id < :before AND (:job IS NULL OR job = :job)
ORDER BY id DESC LIMIT :limit;

-- name: runs_open
-- Runs not complete: metrics derive each one's state.
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs WHERE completed_at IS NULL ORDER BY id;

-- name: runs_finished_summary
-- Complete runs, counted in groups that decide their state (cancelled, failed units against
-- the tolerance): a few rows however many runs there are.
SELECT job, cancelled_at IS NOT NULL AS cancelled, failed,
       CASE WHEN failed = 0 THEN 0 ELSE total END AS total, tolerate, count(*) AS n
FROM wl_runs WHERE completed_at IS NOT NULL
GROUP BY job, cancelled_at IS NOT NULL, failed, CASE WHEN failed = 0 THEN 0 ELSE total END,
         tolerate
ORDER BY job;

-- name: counts_open
SELECT r.job, c.stage, c.state, sum(c.n) AS n
FROM wl_stage_counts AS c JOIN wl_runs AS r ON r.id = c.run_id
WHERE r.completed_at IS NULL AND c.n <> 0
GROUP BY r.job, c.stage, c.state ORDER BY 1, 2, 3;

-- name: pending_heads
-- The age in seconds of the oldest pending item per stage among the :window ids from the run's
-- first pending item (the one workers claim next): bounded by an id range, never the run.
SELECT stage, (julianday('now') - julianday(min(updated_at))) * 86400.0 AS age
FROM wl_items INDEXED BY wl_items_claimable, (
    SELECT min(id) AS id FROM wl_items INDEXED BY wl_items_claimable
    WHERE run_id = :run_id AND state = 'pending') AS head
WHERE run_id = :run_id AND state = 'pending'
  AND wl_items.id >= head.id AND wl_items.id < head.id + :window
GROUP BY stage ORDER BY stage;

-- name: attention_totals
SELECT
    (SELECT count(*) FROM wl_items INDEXED BY wl_items_leased
     WHERE state = 'claimed' AND lease_until < strftime('%Y-%m-%d %H:%M:%f', 'now')),
    (SELECT count(*) FROM wl_items INDEXED BY wl_items_attention
     WHERE state IN ('failed', 'unknown') AND state = 'unknown'),
    (SELECT count(*) FROM wl_items INDEXED BY wl_items_attention
     WHERE state IN ('failed', 'unknown') AND state = 'failed');

-- name: run_attention
-- A run's failed or unknown items through the attention index (never a walk of the run).
SELECT * FROM wl_items INDEXED BY wl_items_attention
WHERE state IN ('failed', 'unknown') AND state = :state AND run_id = :run_id
  AND id > :after_id AND (:stage IS NULL OR stage = :stage)
ORDER BY id LIMIT :limit;

-- name: run_attention_reasons
-- Why a run's items failed (or are unknown): the first :window of them, grouped by reason.
SELECT stage, error, count(*) AS n, min(seq) AS first_seq
FROM (SELECT stage, error, seq FROM wl_items INDEXED BY wl_items_attention
      WHERE state IN ('failed', 'unknown') AND state = :state AND run_id = :run_id
      ORDER BY id LIMIT :window) AS a
GROUP BY stage, error ORDER BY n DESC, stage, error LIMIT :groups;

-- name: run_skip_reasons
-- Why a run's items were skipped: the first :window found, grouped by reason (no index has
-- skipped items, so this walks the run until it has found them).
SELECT stage, error, count(*) AS n, min(seq) AS first_seq
FROM (SELECT stage, error, seq FROM wl_items
      WHERE run_id = :run_id AND state = 'skipped' LIMIT :window) AS a
GROUP BY stage, error ORDER BY n DESC, stage, error LIMIT :groups;

-- name: items_by_key
SELECT * FROM wl_items
WHERE run_id = :run_id AND key = :key AND id > :after_id
  AND (:stage IS NULL OR stage = :stage) AND (:state IS NULL OR state = :state)
ORDER BY id LIMIT :limit;

-- name: events_page
SELECT * FROM wl_events WHERE run_id = :run_id AND id > :after_id ORDER BY id LIMIT :limit;

-- name: runs_prunable
-- Runs complete (a cancelled run whose items are all terminal is) before the cutoff.
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs
WHERE completed_at IS NOT NULL AND completed_at < strftime('%Y-%m-%d %H:%M:%f', 'now', :cutoff)
  AND (:job IS NULL OR job = :job) AND id > :after_id
ORDER BY id LIMIT :limit;

-- name: run_prune
-- The first step of pruning a run: its row goes, checked again against the cutoff and its
-- items (none may be pending, claimed or unknown). Its items, events and counts follow.
DELETE FROM wl_runs
WHERE id = :run_id AND completed_at IS NOT NULL
  AND completed_at < strftime('%Y-%m-%d %H:%M:%f', 'now', :cutoff)
  AND NOT EXISTS (SELECT 1 FROM wl_items WHERE run_id = :run_id
                  AND state IN ('pending', 'claimed', 'unknown'))
  AND NOT (coalesce(closing, 0) = 1 AND cancelled_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM wl_items WHERE run_id = :run_id AND stage = '@close'
                           AND state IN ('processed', 'failed', 'skipped')))
RETURNING id;

-- name: runs_unclosed
-- Of these runs, those recorded with a closing hook (migration 0012) that has not run yet:
-- not cancelled, and no terminal (or unknown) @close entry. prune keeps them, and says why.
SELECT r.id FROM wl_runs AS r
WHERE r.id IN (SELECT value FROM json_each(:run_ids)) AND r.closing = 1
  AND r.cancelled_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM wl_items AS i WHERE i.run_id = r.id AND i.stage = '@close'
                  AND i.state IN ('processed', 'failed', 'skipped', 'unknown'))
ORDER BY r.id;

-- name: items_prune
-- One bounded batch of a pruned run's items (its run row is gone: nothing else moves them).
DELETE FROM wl_items
WHERE id IN (SELECT id FROM wl_items WHERE run_id = :run_id LIMIT :limit)
  AND NOT EXISTS (SELECT 1 FROM wl_runs WHERE id = :run_id)
RETURNING stage, state;

-- name: events_prune
DELETE FROM wl_events
WHERE id IN (SELECT id FROM wl_events WHERE run_id = :run_id LIMIT :limit)
  AND NOT EXISTS (SELECT 1 FROM wl_runs WHERE id = :run_id)
RETURNING id;

-- name: counts_prune
-- The last step: the counters of a pruned run once it has no item left. Until then these rows
-- mark a prune that stopped part-way (runs_orphaned).
DELETE FROM wl_stage_counts
WHERE run_id = :run_id AND NOT EXISTS (SELECT 1 FROM wl_items WHERE run_id = :run_id)
  AND NOT EXISTS (SELECT 1 FROM wl_runs WHERE id = :run_id);

-- name: runs_orphaned
SELECT DISTINCT run_id FROM wl_stage_counts AS c
WHERE NOT EXISTS (SELECT 1 FROM wl_runs AS r WHERE r.id = c.run_id)
ORDER BY run_id;

-- Dispatch through a broker (docs/design.md, "Dispatch through a broker"; migration 0007).

-- name: items_claim_by_identity
-- moves: pending -> claimed
-- A broker task's claim: exactly the items its message names (one run, one stage, some seqs),
-- found through the unique (run_id, stage, seq) index, so it costs O(seqs) at any run size.
-- Only items still pending and due in a run of the message's job, decomposed, not paused, not
-- cancelled: a copy of a message already claimed finds nothing. redispatch_at becomes the claim's time: the item
-- is owed a message as soon as it is pending again (a retry, a release, an expired lease).
UPDATE wl_items SET
    state = 'claimed',
    started_at = NULL,
    -- a retry's backoff is served once it is claimed: a release or a reclaim
    -- makes it due at once (a time written by a clock ahead would stay)
    not_before = NULL,
    lease_token = :token,
    holder = :holder,
    lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', :lease),
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now'),
    redispatch_at = strftime('%Y-%m-%d %H:%M:%f', 'now'),
    dispatches = 0,
    held_until = NULL
WHERE id IN (
    SELECT id FROM wl_items INDEXED BY sqlite_autoindex_wl_items_1
    WHERE run_id = :run_id AND stage = :stage AND seq IN (SELECT value FROM json_each(:seqs))
      AND state = 'pending'
      -- due, or written by a clock ahead of this one (updated_at, same statement):
      AND (not_before IS NULL OR not_before <= strftime('%Y-%m-%d %H:%M:%f', 'now')
           OR updated_at > strftime('%Y-%m-%d %H:%M:%f', 'now'))
      -- not held for a later message (0013): held until the message's own hold at most
      AND (held_until IS NULL OR held_until <= max(strftime('%Y-%m-%d %H:%M:%f', 'now'),
           COALESCE(strftime('%Y-%m-%d %H:%M:%f', :held / 1000.0, 'unixepoch'), '')))
    -- no more than a limited stage's bucket and cap allow (all of them otherwise)
    ORDER BY id LIMIT :limit)
  AND stage <> '@close'
  AND EXISTS (SELECT 1 FROM wl_runs r WHERE r.id = :run_id AND r.job = :job
              AND r.decomposed_at IS NOT NULL AND r.paused_at IS NULL
              AND r.cancelled_at IS NULL)
RETURNING id, run_id, stage, seq, key, data, attempts, lease_token, error;

-- name: items_owe
-- Before a run dispatched through a broker is marked decomposed: a page (in id order) of its
-- first stage's pending rows owes a message from :wait seconds from now, in case the process
-- dies between the mark and the publish. Nothing of the run is claimable before the mark.
UPDATE wl_items SET
    redispatch_at = strftime('%Y-%m-%d %H:%M:%f', 'now',
                             '+' || printf('%.3f', :wait) || ' seconds'),
    dispatches = 1
WHERE id IN (SELECT id FROM wl_items INDEXED BY wl_items_claimable
             WHERE run_id = :run_id AND state = 'pending' AND stage = :stage
               AND id > :after_id
             ORDER BY id LIMIT :limit)
RETURNING id;

-- name: items_pending_seqs
-- A page (in id order) of a stage's pending items: what a decomposition's messages name.
SELECT id, seq FROM wl_items INDEXED BY wl_items_claimable
WHERE run_id = :run_id AND state = 'pending' AND stage = :stage AND id > :after_id
ORDER BY id LIMIT :limit;

-- name: items_mark_dispatched
-- Just before their message is published: the items still pending owe the next one from
-- delay (a retry's backoff) plus wait * 2^(messages so far, at most 4) seconds from now.
-- Returns the seqs marked, which are the ones the message names.
UPDATE wl_items SET
    redispatch_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || printf('%.3f',
        :delay + :wait * (1 << min(dispatches, 4))) || ' seconds'),
    dispatches = dispatches + 1
WHERE id IN (
    SELECT id FROM wl_items INDEXED BY sqlite_autoindex_wl_items_1
    WHERE run_id = :run_id AND stage = :stage AND seq IN (SELECT value FROM json_each(:seqs)))
  AND state = 'pending'
RETURNING seq;

-- name: limit_horizon
-- A limited stage's bucket, read in the transaction of limit_lock: the database's time and
-- the bucket's reservation horizon (0013), as seconds since the epoch.
SELECT (julianday('now') - 2440587.5) * 86400.0 AS now,
       (julianday(held_until) - 2440587.5) * 86400.0 AS held_until
FROM wl_stage_limits WHERE job = :job AND stage = :stage;

-- name: limit_hold
-- The bucket's refill is promised to held-back messages until :held (ms since the epoch).
UPDATE wl_stage_limits SET held_until = strftime('%Y-%m-%d %H:%M:%f', :held / 1000.0,
                                                 'unixepoch')
WHERE job = :job AND stage = :stage;

-- name: items_holdable
-- Of the items a broker task's limited claim left, those to hold back (0013): still pending,
-- due, of a claimable run of the job, and not held for a later message already (a copy of an
-- earlier message finds none), found by identity, in id order.
SELECT id FROM wl_items INDEXED BY sqlite_autoindex_wl_items_1
WHERE run_id = :run_id AND stage = :stage AND seq IN (SELECT value FROM json_each(:seqs))
  AND state = 'pending'
  AND (not_before IS NULL OR not_before <= strftime('%Y-%m-%d %H:%M:%f', 'now')
       OR updated_at > strftime('%Y-%m-%d %H:%M:%f', 'now'))
  AND (held_until IS NULL OR held_until <= max(strftime('%Y-%m-%d %H:%M:%f', 'now'),
       COALESCE(strftime('%Y-%m-%d %H:%M:%f', :held / 1000.0, 'unixepoch'), '')))
  AND stage <> '@close'
  AND EXISTS (SELECT 1 FROM wl_runs r WHERE r.id = :run_id AND r.job = :job
              AND r.decomposed_at IS NOT NULL AND r.paused_at IS NULL
              AND r.cancelled_at IS NULL)
ORDER BY id;

-- name: items_hold
-- Held-back items, each held until its message's due time (ms since the epoch) and owed the
-- next message from then plus wait * 2^(messages so far, at most 4), as items_mark_dispatched.
UPDATE wl_items SET
    held_until = strftime('%Y-%m-%d %H:%M:%f', h.due / 1000.0, 'unixepoch'),
    redispatch_at = strftime('%Y-%m-%d %H:%M:%f', h.due / 1000.0, 'unixepoch',
        '+' || printf('%.3f', :wait * (1 << min(dispatches, 4))) || ' seconds'),
    dispatches = dispatches + 1
FROM (SELECT i.value AS id, d.value AS due
      FROM json_each(:ids) AS i JOIN json_each(:dues) AS d ON d.key = i.key) AS h
WHERE wl_items.id = h.id
RETURNING id, seq;

-- name: items_owed
-- The sweeper's re-dispatch: a run's pending items whose message is overdue (lost by the
-- broker, or never published), due themselves, oldest first; through wl_items_owed alone.
-- And, given :wait, those whose re-dispatch time lies further ahead than any honest writer
-- puts it (the item's own due time, a backoff's or a bucket's hold, plus 16 waits): written by
-- a process whose clock runs ahead, so owed now. Each is its own range of the index (up to
-- now; from now + 17 waits on), so that neither walks the run's items owed later.
SELECT stage, seq FROM (
  SELECT * FROM (
    SELECT stage, seq, redispatch_at FROM wl_items INDEXED BY wl_items_owed
    WHERE run_id = :run_id AND state = 'pending' AND redispatch_at IS NOT NULL
      AND redispatch_at <= strftime('%Y-%m-%d %H:%M:%f', 'now')
      AND (not_before IS NULL OR not_before <= strftime('%Y-%m-%d %H:%M:%f', 'now') OR updated_at > strftime('%Y-%m-%d %H:%M:%f', 'now'))
      AND stage <> '@close'
    ORDER BY redispatch_at LIMIT :limit)
  UNION ALL
  SELECT * FROM (
    SELECT stage, seq, redispatch_at FROM wl_items INDEXED BY wl_items_owed
    WHERE run_id = :run_id AND state = 'pending' AND :wait IS NOT NULL
      AND redispatch_at > strftime('%Y-%m-%d %H:%M:%f', 'now',
                                   '+' || printf('%.3f', 17 * :wait) || ' seconds')
      AND redispatch_at > strftime('%Y-%m-%d %H:%M:%f',
          max(strftime('%Y-%m-%d %H:%M:%f', 'now'), COALESCE(held_until, ''),
              CASE WHEN updated_at > strftime('%Y-%m-%d %H:%M:%f', 'now') THEN ''
                   ELSE COALESCE(not_before, '') END),
          '+' || printf('%.3f', 17 * :wait) || ' seconds')
      AND (not_before IS NULL OR not_before <= strftime('%Y-%m-%d %H:%M:%f', 'now') OR updated_at > strftime('%Y-%m-%d %H:%M:%f', 'now'))
      AND stage <> '@close'
    ORDER BY redispatch_at LIMIT :limit))
ORDER BY redispatch_at LIMIT :limit;

-- == schedules and deadlines (migration 0014; docs/design.md, "Schedules and deadlines") ======

-- name: db_now
SELECT strftime('%Y-%m-%d %H:%M:%f', 'now') AS now;

-- name: schedule_declare
-- A new schedule starts at its first planned time after now; a changed spec, time zone or job
-- starts again from now; an unchanged declaration keeps where it is (a restart catches up).
INSERT INTO wl_schedules (name, job, spec, tz, next_fire_at)
VALUES (:name, :job, :spec, :tz, :next_at)
ON CONFLICT (name) DO UPDATE SET job = excluded.job, spec = excluded.spec, tz = excluded.tz,
    next_fire_at = excluded.next_fire_at,
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE wl_schedules.spec <> excluded.spec OR wl_schedules.tz <> excluded.tz
   OR wl_schedules.job <> excluded.job;

-- name: schedule_declare_new
-- The CLI's and the API's declarations: only a schedule never recorded (their app may be older
-- than the workers').
INSERT INTO wl_schedules (name, job, spec, tz, next_fire_at)
VALUES (:name, :job, :spec, :tz, :next_at)
ON CONFLICT (name) DO NOTHING;

-- name: schedules_all
SELECT s.name, s.job, s.spec, s.tz, s.next_fire_at, s.waiting_fire_at, s.missed, s.paused_at,
       s.paused_by,
       (SELECT max(f.fire_at) FROM wl_firings AS f WHERE f.schedule = s.name) AS last_fire_at,
       (SELECT f.run_id FROM wl_firings AS f WHERE f.schedule = s.name AND f.state = 'submitted'
        ORDER BY f.fire_at DESC LIMIT 1) AS last_run_id
FROM wl_schedules AS s ORDER BY s.name;

-- name: schedule_advance
-- The compare-and-set of a planned firing: only the sweeper that finds next_fire_at where it
-- read it moves it on, in the transaction that records the firing.
UPDATE wl_schedules SET next_fire_at = :next_at, missed = missed + :missed,
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE name = :name AND next_fire_at = :expected AND paused_at IS NULL;

-- name: schedule_take_waiting
UPDATE wl_schedules SET waiting_fire_at = NULL, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE name = :name AND waiting_fire_at = :expected AND paused_at IS NULL;

-- name: schedule_wait
UPDATE wl_schedules SET waiting_fire_at = :fire_at WHERE name = :name AND waiting_fire_at IS NULL;

-- name: schedule_open_run
-- An earlier run of the schedule that is not complete: among its job's open runs only.
SELECT r.id FROM wl_runs AS r INDEXED BY wl_runs_open
JOIN wl_firings AS f ON f.run_id = r.id AND f.schedule = :name AND f.state = 'submitted'
WHERE r.job = :job AND r.completed_at IS NULL AND r.cancelled_at IS NULL
ORDER BY r.id LIMIT 1;

-- name: firing_get
SELECT schedule, fire_at, state, run_id, error, attempts, actor, recorded_at
FROM wl_firings WHERE schedule = :name AND fire_at = :fire_at;

-- name: firing_record
-- A firing is recorded once; only a failed one (tried again) or a waiting one (its run now
-- submitted) is written over.
INSERT INTO wl_firings (schedule, fire_at, state, run_id, error, attempts, actor)
VALUES (:name, :fire_at, :state, :run_id, :error, 1, :actor)
ON CONFLICT (schedule, fire_at) DO UPDATE SET state = excluded.state, run_id = excluded.run_id,
    error = excluded.error, actor = excluded.actor,
    attempts = wl_firings.attempts + (CASE WHEN wl_firings.state = 'failed' THEN 1 ELSE 0 END),
    recorded_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE wl_firings.state IN ('failed', 'waiting');

-- name: firings_list
SELECT schedule, fire_at, state, run_id, error, attempts, actor, recorded_at
FROM wl_firings WHERE schedule = :name ORDER BY fire_at DESC LIMIT :limit;

-- name: firings_failed
SELECT schedule, fire_at, state, run_id, error, attempts, actor, recorded_at
FROM wl_firings INDEXED BY wl_firings_failed WHERE state = 'failed'
ORDER BY schedule, fire_at LIMIT :limit;

-- name: schedule_pause
UPDATE wl_schedules SET paused_at = strftime('%Y-%m-%d %H:%M:%f', 'now'), paused_by = :actor,
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE name = :name AND paused_at IS NULL;

-- name: schedule_resume
UPDATE wl_schedules SET paused_at = NULL, paused_by = :actor,
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE name = :name AND paused_at IS NOT NULL;

-- name: run_set_deadline
-- A deadline given as a time (:deadline_at) or as seconds after submission (:deadline_in, a
-- modifier); the warning starts :warn_before (a modifier, or NULL: no warning) before it.
UPDATE wl_runs SET
    deadline_at = CASE WHEN :deadline_at IS NOT NULL THEN :deadline_at
                       ELSE strftime('%Y-%m-%d %H:%M:%f', created_at, :deadline_in) END,
    warn_at = strftime('%Y-%m-%d %H:%M:%f',
                       CASE WHEN :deadline_at IS NOT NULL THEN :deadline_at
                            ELSE strftime('%Y-%m-%d %H:%M:%f', created_at, :deadline_in) END,
                       :warn_before)
WHERE id = :run_id;

-- name: runs_mark_deadline_missed
-- Open runs past their deadline not yet noted: noted once (an event each, same transaction).
UPDATE wl_runs SET deadline_missed_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (SELECT id FROM wl_runs INDEXED BY wl_runs_deadline
             WHERE deadline_at IS NOT NULL AND completed_at IS NULL AND cancelled_at IS NULL
               AND deadline_missed_at IS NULL
               AND deadline_at < strftime('%Y-%m-%d %H:%M:%f', 'now')
             ORDER BY deadline_at LIMIT :limit)
RETURNING id, job, idempotency_key, deadline_at, total, processed, failed, skipped;

-- name: runs_deadlines
-- Open runs past their deadline or inside its warning, with the database's now.
SELECT id, job, idempotency_key, deadline_at, warn_at, total, processed, failed, skipped,
       strftime('%Y-%m-%d %H:%M:%f', 'now') AS now
FROM wl_runs INDEXED BY wl_runs_deadline
WHERE deadline_at IS NOT NULL AND completed_at IS NULL AND cancelled_at IS NULL
  AND (deadline_at <= strftime('%Y-%m-%d %H:%M:%f', 'now')
       OR warn_at <= strftime('%Y-%m-%d %H:%M:%f', 'now'))
ORDER BY deadline_at LIMIT :limit;
