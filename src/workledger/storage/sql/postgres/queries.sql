-- PostgreSQL queries. Every name here exists in ../sqlite/queries.sql too (tests check it).
-- Parameters are psycopg named placeholders. Times are timestamptz from the database clock (now():
-- the start of the transaction, and every port method is one short transaction). JSON arrives as
-- text and is cast to jsonb here; id lists arrive as arrays.
-- A '-- moves:' line lists every change of wl_items.state its statement can make; a test
-- derives the literal ones from the SQL and checks all against core/states.py MOVES.

-- name: run_insert
INSERT INTO wl_runs (job, idempotency_key, payload, tolerate, priority, tenant, closing)
VALUES (%(job)s, %(key)s, %(payload)s::jsonb, %(tolerate)s::float8, %(priority)s::integer,
        %(tenant)s::text, %(closing)s::boolean)
ON CONFLICT (job, idempotency_key) DO NOTHING
RETURNING id;

-- name: runs_insert_many
-- submit_many's run rows in one statement (parallel arrays, in the call's order); a key that
-- names a run already inserts nothing (RETURNING: the new ones only).
INSERT INTO wl_runs (job, idempotency_key, payload, tolerate, priority, tenant, closing)
SELECT r.job, r.key, r.payload::jsonb, r.tolerate, r.priority, r.tenant, r.closing
FROM unnest(%(jobs)s::text[], %(keys)s::text[], %(payloads)s::text[], %(tolerates)s::float8[],
            %(priorities)s::integer[], %(tenants)s::text[], %(closings)s::boolean[])
     WITH ORDINALITY AS r (job, key, payload, tolerate, priority, tenant, closing, n)
ORDER BY r.n
ON CONFLICT (job, idempotency_key) DO NOTHING
RETURNING id, idempotency_key;

-- name: runs_mark_new
-- submit_many's mark of the runs it has just recorded with all their items, in one statement,
-- counted from the rows it wrote (run_mark_decomposed recounts from the stage counts instead);
-- a run of only skipped items (or of none) is complete.
UPDATE wl_runs AS r SET
    decomposed_at = now(),
    total = u.total,
    skipped = u.skipped,
    completed_at = CASE WHEN u.total = u.skipped THEN now() END
FROM unnest(%(run_ids)s::bigint[], %(totals)s::bigint[], %(skips)s::bigint[])
     AS u (id, total, skipped)
WHERE r.id = u.id
RETURNING r.id, r.job, r.idempotency_key, NULL AS payload, r.created_at, r.decomposed_at,
          r.completed_at, r.paused_at, r.cancelled_at, r.error, r.total, r.processed,
          r.failed, r.skipped, r.tolerate, r.priority, r.tenant;

-- name: events_submitted_many
-- submit_many's `submitted` event of every run it has just inserted, built by the database
-- from the rows themselves (the runs exist: this transaction wrote them, and holds them).
INSERT INTO wl_events (run_id, kind, detail)
SELECT r.id, 'submitted', jsonb_build_object('key', r.idempotency_key) FROM wl_runs AS r
WHERE r.id = ANY (%(run_ids)s::bigint[]) ORDER BY r.id;

-- name: events_decomposed_many
-- submit_many's `decomposed` event of every run it has just marked, with its total.
INSERT INTO wl_events (run_id, kind, detail)
SELECT r.id, 'decomposed', jsonb_build_object('total', r.total) FROM wl_runs AS r
WHERE r.id = ANY (%(run_ids)s::bigint[]) ORDER BY r.id;

-- name: run_by_key
SELECT * FROM wl_runs WHERE job = %(job)s AND idempotency_key = %(key)s;

-- name: run_get
-- Every column but the payload, which can be large and no reader shows: run_payload reads it.
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs WHERE id = %(run_id)s;

-- name: run_payload
SELECT payload FROM wl_runs WHERE id = %(run_id)s;

-- name: runs_list
-- Newest first, below an id to page back; without payloads (see run_get).
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs WHERE (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text
       OR (%(tenant)s::text = 'default' AND tenant IS NULL))
ORDER BY id DESC LIMIT %(limit)s;

-- name: runs_count
SELECT count(*) FROM wl_runs WHERE (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text
       OR (%(tenant)s::text = 'default' AND tenant IS NULL));

-- name: run_mark_decomposed
UPDATE wl_runs SET
    decomposed_at = COALESCE(decomposed_at, now()),
    error = NULL,
    total = (SELECT COALESCE(sum(n), 0) FROM wl_stage_counts
             WHERE run_id = %(run_id)s AND stage = %(stage)s),
    skipped = (SELECT COALESCE(sum(n), 0) FROM wl_stage_counts
               WHERE run_id = %(run_id)s AND state = 'skipped'),
    completed_at = CASE
        WHEN NOT EXISTS (SELECT 1 FROM wl_stage_counts WHERE run_id = %(run_id)s AND n > 0
                         AND state NOT IN ('processed', 'failed', 'skipped'))
        THEN COALESCE(completed_at, now()) END
WHERE id = %(run_id)s
RETURNING id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
          paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant;

-- name: run_record_error
UPDATE wl_runs SET error = %(error)s WHERE id = %(run_id)s;

-- name: runs_claimable
-- The claim order (docs/design.md, "Claim order"): higher priorities first, then oldest first;
-- each run with its tenant's weight (1 without a row in wl_tenants).
SELECT r.id, r.job, r.priority, r.tenant, COALESCE(t.weight, 1) FROM wl_runs AS r
LEFT JOIN wl_tenants AS t ON t.name = COALESCE(r.tenant, 'default')
WHERE r.decomposed_at IS NOT NULL AND r.completed_at IS NULL
  AND r.paused_at IS NULL AND r.cancelled_at IS NULL
  AND r.job = ANY (%(jobs)s::text[])
ORDER BY r.priority DESC, r.id;

-- name: runs_top_priority
-- The highest priority among the runs runs_claimable lists: per job, one step at the end of
-- wl_runs_claimable (a worker asks before every claim, so never a walk over the open runs).
SELECT max((SELECT r.priority FROM wl_runs AS r
            WHERE r.job = j.job AND r.decomposed_at IS NOT NULL AND r.completed_at IS NULL
              AND r.paused_at IS NULL AND r.cancelled_at IS NULL
            ORDER BY r.priority DESC LIMIT 1))
FROM unnest(%(jobs)s::text[]) AS j (job);

-- name: run_priority
-- An open run's priority before set_priority changes it (locked: two operators' changes are
-- recorded one after the other).
SELECT priority FROM wl_runs WHERE id = %(run_id)s AND completed_at IS NULL FOR UPDATE;

-- name: run_set_priority
UPDATE wl_runs SET priority = %(priority)s WHERE id = %(run_id)s AND completed_at IS NULL;

-- name: tenant_weight
-- A tenant's weight before tenant_set_weight changes it, locked: two operators setting one
-- tenant's weight at once are told apart (the second sees the first's).
SELECT weight FROM wl_tenants WHERE name = %(name)s FOR UPDATE;

-- name: tenant_set_weight
INSERT INTO wl_tenants (name, weight, updated_by, note)
VALUES (%(name)s, %(weight)s, %(actor)s, %(note)s)
ON CONFLICT (name) DO UPDATE SET weight = excluded.weight, updated_by = excluded.updated_by,
    note = excluded.note, updated_at = now();

-- name: tenants_list
SELECT name, weight, updated_at, updated_by, note FROM wl_tenants ORDER BY name;

-- name: tenant_open_runs
SELECT count(*) FROM wl_runs
WHERE completed_at IS NULL
  AND (tenant = %(tenant)s::text OR (%(tenant)s::text = 'default' AND tenant IS NULL));

-- name: run_counts
-- The projection: a few rows per run, however many items it has. Stages in the order they first
-- appeared (the first row of each stage, counting rows whose n has dropped to 0).
SELECT stage, state, n FROM (
    SELECT stage, state, n, id, min(id) OVER (PARTITION BY stage) AS first
    FROM wl_stage_counts WHERE run_id = %(run_id)s) AS c
WHERE n <> 0
ORDER BY first, id;

-- name: run_counts_compare
-- Reconcile: the items' counts (the authority) and the stored ones, read in one statement so
-- both come from one snapshot.
SELECT 'ledger' AS side, stage, state, count(*) AS n, min(id) AS first
FROM wl_items WHERE run_id = %(run_id)s GROUP BY stage, state
UNION ALL
SELECT 'stored', stage, state, n, first FROM (
    SELECT stage, state, n, id, min(id) OVER (PARTITION BY stage) AS first
    FROM wl_stage_counts WHERE run_id = %(run_id)s) AS c
WHERE n <> 0
ORDER BY 1, 5, 2, 3;

-- name: counts_lock
-- Reconcile holds the run's counters, in the order every writer takes them, while it compares.
SELECT stage, state FROM wl_stage_counts WHERE run_id = %(run_id)s
ORDER BY stage COLLATE "C", state COLLATE "C" FOR UPDATE;

-- name: counts_add
-- One row per (stage, state) a transaction moved, sorted, as the transaction's last statement:
-- every transaction takes these hot rows in the same order, after all its other locks.
INSERT INTO wl_stage_counts (run_id, stage, state, n)
SELECT c.run_id, c.stage, c.state, c.n
FROM unnest(%(run_ids)s::bigint[], %(stages)s::text[], %(states)s::text[], %(ns)s::bigint[])
     AS c (run_id, stage, state, n)
ON CONFLICT (run_id, stage, state) DO UPDATE SET n = wl_stage_counts.n + excluded.n;

-- name: run_waits
-- Expired leases, retries not yet due and unknown items awaiting their verify hook, for status:
-- each walks a small partial index.
SELECT
    (SELECT count(*) FROM wl_items
     WHERE state = 'claimed' AND lease_until < now() AND run_id = %(run_id)s) AS expired,
    (SELECT count(*) FROM wl_items
     WHERE run_id = %(run_id)s AND state = 'pending' AND not_before IS NOT NULL
       AND not_before > now()) AS waiting,
    (SELECT count(*) FROM wl_items
     WHERE state = 'unknown' AND run_id = %(run_id)s AND error = %(verify)s) AS verifying;

-- name: run_add_units
-- total: rows a decomposition batch wrote (0 for every other write; the mark recounts).
UPDATE wl_runs SET
    total = total + %(total)s,
    processed = processed + %(processed)s,
    failed = failed + %(failed)s,
    skipped = skipped + %(skipped)s,
    completed_at = CASE
        WHEN decomposed_at IS NOT NULL
             AND processed + %(processed)s + failed + %(failed)s + skipped + %(skipped)s
                 >= total + %(total)s
        THEN COALESCE(completed_at, now()) END
WHERE id = %(run_id)s
RETURNING cancelled_at;

-- name: runs_lock
-- Before runs_add_units: the run rows of a chunk claimed across runs, locked in id order (the
-- order every writer of several runs takes them: docs/design.md, "Lock order on PostgreSQL").
SELECT id FROM wl_runs WHERE id = ANY (%(run_ids)s::bigint[]) ORDER BY id FOR UPDATE;

-- name: runs_add_units
-- run_add_units for the runs of a chunk claimed across runs, in one statement, one row per
-- run; total is not moved (a finish adds none).
UPDATE wl_runs AS r SET
    processed = r.processed + u.processed,
    failed = r.failed + u.failed,
    skipped = r.skipped + u.skipped,
    completed_at = CASE
        WHEN r.decomposed_at IS NOT NULL
             AND r.processed + u.processed + r.failed + u.failed + r.skipped + u.skipped
                 >= r.total
        THEN COALESCE(r.completed_at, now()) END
FROM unnest(%(run_ids)s::bigint[], %(processed)s::bigint[], %(failed)s::bigint[],
            %(skipped)s::bigint[]) AS u (id, processed, failed, skipped)
WHERE r.id = u.id
RETURNING r.id, r.cancelled_at;

-- name: items_insert
-- moves: (none) -> pending, skipped
-- One statement per batch: the rows arrive as parallel arrays (seqs[i], keys[i], ...), sent in
-- binary because dumping large arrays as text costs more than the insert itself.
INSERT INTO wl_items (run_id, stage, seq, key, data, state, error, concurrency_key)
SELECT %(run_id)s, %(stage)s, u.seq, u.key, u.data::jsonb, u.state, u.error, u.ckey
FROM unnest(%(seqs)b::bigint[], %(keys)b::text[], %(datas)b::text[], %(states)b::text[],
            %(errors)b::text[], %(ckeys)b::text[]) AS u (seq, key, data, state, error, ckey)
ON CONFLICT (run_id, stage, seq) DO NOTHING;

-- name: items_insert_runs
-- moves: (none) -> pending, skipped
-- items_insert for the items of several runs recorded by one submit_many, in one statement.
INSERT INTO wl_items (run_id, stage, seq, key, data, state, error, concurrency_key)
SELECT u.run_id, u.stage, u.seq, u.key, u.data::jsonb, u.state, u.error, u.ckey
FROM unnest(%(run_ids)b::bigint[], %(stages)b::text[], %(seqs)b::bigint[], %(keys)b::text[],
            %(datas)b::text[], %(states)b::text[], %(errors)b::text[], %(ckeys)b::text[])
     AS u (run_id, stage, seq, key, data, state, error, ckey)
ON CONFLICT (run_id, stage, seq) DO NOTHING;

-- name: items_claim
-- moves: pending -> claimed
-- One statement: one token for the whole claim (a volatile CTE is evaluated once), the chunk locked
-- with SKIP LOCKED so concurrent claimers take disjoint rows, nothing claimed from a paused,
-- cancelled or not yet decomposed run.
-- The token: the server's timeline in its high bits (docs/design.md, "Fencing: one token per claim"), so a
-- promoted standby, whose sequence may hand out a lost window's values again, never gives
-- out a token of the old timeline.
WITH token AS (SELECT (('x' || left(pg_walfile_name(pg_current_wal_insert_lsn()), 8))
                           ::bit(32)::bigint << 40) + nextval('wl_lease_token_seq') AS value),
picked AS (
    SELECT i.id FROM wl_items AS i
    WHERE i.run_id = %(run_id)s AND i.state = 'pending' AND i.id > %(after_id)s
      AND (i.not_before IS NULL OR i.not_before <= now())
      -- the closing entry is the sweeper's to claim (closing = true), never a worker's
      AND (i.stage = '@close') = %(closing)s::boolean
      AND EXISTS (SELECT 1 FROM wl_runs AS r WHERE r.id = %(run_id)s
                  AND r.decomposed_at IS NOT NULL AND r.paused_at IS NULL
                  AND r.cancelled_at IS NULL)
    ORDER BY i.id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
UPDATE wl_items SET
    state = 'claimed',
    started_at = NULL,
    -- a retry's backoff is served once it is claimed: a release or a reclaim
    -- makes it due at once (a time written by a clock ahead would stay)
    not_before = NULL,
    held_until = NULL,  -- a broker's hold ends with any claim (0013)
    lease_token = (SELECT value FROM token),
    holder = %(holder)s,
    lease_until = now() + make_interval(secs => %(lease)s::float8),
    updated_at = now()
-- an id array, not a join: a join lets the planner hash the whole table for every claim
WHERE wl_items.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING wl_items.id, wl_items.run_id, wl_items.stage, wl_items.seq, wl_items.key,
          wl_items.data, wl_items.attempts, wl_items.lease_token, wl_items.error;

-- name: items_claim_runs
-- moves: pending -> claimed
-- A claim across runs (ClaimParams.run_ids, issue 25): the pending items of several runs of one
-- job (the first run's) in one statement, run by run in id order, each run through its own
-- scan of wl_items_claimable (LATERAL, LIMIT): O(limit + runs listed) however big the runs
-- are, since the outer LIMIT stops the walk. A run paused, cancelled, not yet decomposed or of
-- another job gives nothing; the closing entry never. The token as in items_claim.
WITH token AS (SELECT (('x' || left(pg_walfile_name(pg_current_wal_insert_lsn()), 8))
                           ::bit(32)::bigint << 40) + nextval('wl_lease_token_seq') AS value),
job AS (SELECT job FROM wl_runs WHERE id = %(run_id)s),
picked AS (
    -- run by run (LATERAL, one run's claimable items each), in id order; a run's own checks
    -- are a one-row primary-key lookup per run, never a walk of the job's runs
    SELECT i.id FROM (SELECT DISTINCT id FROM unnest(%(run_ids)s::bigint[]) AS u (id)
                      ORDER BY id) AS u
    CROSS JOIN LATERAL (
        SELECT w.id FROM wl_items AS w
        WHERE w.run_id = u.id AND w.state = 'pending' AND w.stage <> '@close'
          AND (w.not_before IS NULL OR w.not_before <= now())
          AND EXISTS (SELECT 1 FROM wl_runs AS r WHERE r.id = u.id
                      AND r.job = (SELECT job FROM job) AND r.decomposed_at IS NOT NULL
                      AND r.paused_at IS NULL AND r.cancelled_at IS NULL)
        ORDER BY w.id LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED) AS i
    LIMIT %(limit)s)
UPDATE wl_items SET
    state = 'claimed',
    started_at = NULL,
    not_before = NULL,  -- a retry's backoff is served once it is claimed (items_claim)
    held_until = NULL,  -- a broker's hold ends with any claim (0013)
    lease_token = (SELECT value FROM token),
    holder = %(holder)s,
    lease_until = now() + make_interval(secs => %(lease)s::float8),
    updated_at = now()
WHERE wl_items.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING wl_items.id, wl_items.run_id, wl_items.stage, wl_items.seq, wl_items.key,
          wl_items.data, wl_items.attempts, wl_items.lease_token, wl_items.error;

-- name: items_claim_stage
-- moves: pending -> claimed
-- A limited job's claim, one stage at a time (ClaimParams.stages), each through
-- wl_items_stage_claimable so that it stays O(limit) however the stages' rows interleave. The
-- statements of one claim share one token: the first that finds rows takes it from the
-- sequence (token NULL), the others are given it.
-- The token: the server's timeline in its high bits (docs/design.md, "Fencing: one token per claim"), so a
-- promoted standby, whose sequence may hand out a lost window's values again, never gives
-- out a token of the old timeline.
WITH token AS (SELECT (('x' || left(pg_walfile_name(pg_current_wal_insert_lsn()), 8))
                           ::bit(32)::bigint << 40) + nextval('wl_lease_token_seq') AS value),
picked AS (
    SELECT i.id FROM wl_items AS i
    WHERE i.run_id = %(run_id)s AND i.stage = %(stage)s AND i.state = 'pending'
      AND (i.not_before IS NULL OR i.not_before <= now())
      AND EXISTS (SELECT 1 FROM wl_runs AS r WHERE r.id = %(run_id)s
                  AND r.decomposed_at IS NOT NULL AND r.paused_at IS NULL
                  AND r.cancelled_at IS NULL)
    ORDER BY i.id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
UPDATE wl_items SET
    state = 'claimed',
    started_at = NULL,
    -- a retry's backoff is served once it is claimed: a release or a reclaim
    -- makes it due at once (a time written by a clock ahead would stay)
    not_before = NULL,
    held_until = NULL,  -- a broker's hold ends with any claim (0013)
    lease_token = COALESCE(%(token)s::bigint, (SELECT value FROM token)),
    holder = %(holder)s,
    lease_until = now() + make_interval(secs => %(lease)s::float8),
    updated_at = now()
WHERE wl_items.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING wl_items.id, wl_items.run_id, wl_items.stage, wl_items.seq, wl_items.key,
          wl_items.data, wl_items.attempts, wl_items.lease_token, wl_items.error;

-- name: keys_in_flight
-- A stage with max_per_key (0017): how many items of each concurrency key the job's runs have
-- claimed now, counted from the rows themselves through wl_items_keyed_claimed (one entry per
-- keyed item in flight). Read after the stage's bucket was locked (limit_lock): every claimer
-- of the stage waits for the one before it, and this statement's snapshot sees its claims.
SELECT i.concurrency_key, count(*) FROM wl_items AS i
JOIN wl_runs AS r ON r.id = i.run_id
WHERE i.state = 'claimed' AND i.concurrency_key IS NOT NULL AND i.stage = %(stage)s
  AND r.job = %(job)s
GROUP BY i.concurrency_key;

-- name: items_keyed_pending
-- The pending, due rows of one run's stage a keyed claim chooses from (core/rates.py
-- pick_by_key), in id order, the keys already full left out before the window is cut.
SELECT i.id, i.concurrency_key FROM wl_items AS i
WHERE i.run_id = %(run_id)s AND i.stage = %(stage)s AND i.state = 'pending'
  AND (i.not_before IS NULL OR i.not_before <= now())
  AND (i.concurrency_key IS NULL OR i.concurrency_key <> ALL (%(full)s::text[]))
ORDER BY i.id LIMIT %(limit)s;

-- name: items_keyed_named
-- A broker task's claim of a stage with max_per_key: the named rows still pending, with their
-- keys, found by identity, in id order (pick_by_key then chooses what the keys allow).
SELECT i.id, i.seq, i.concurrency_key FROM wl_items AS i
WHERE i.run_id = %(run_id)s AND i.stage = %(stage)s AND i.seq = ANY (%(seqs)s::bigint[])
  AND i.state COLLATE "C" = 'pending'
ORDER BY i.id;

-- name: items_claim_ids
-- moves: pending -> claimed
-- A keyed claim's chosen rows, still pending, of a run that may be claimed from, locked in id
-- order with SKIP LOCKED; the token is the claim's (the first statement that finds rows takes
-- it from the sequence, as items_claim_stage does).
WITH token AS (SELECT (('x' || left(pg_walfile_name(pg_current_wal_insert_lsn()), 8))
                           ::bit(32)::bigint << 40) + nextval('wl_lease_token_seq') AS value),
picked AS (
    SELECT i.id FROM wl_items AS i
    WHERE i.id = ANY (%(ids)s::bigint[]) AND i.run_id = %(run_id)s AND i.state = 'pending'
      AND EXISTS (SELECT 1 FROM wl_runs AS r WHERE r.id = %(run_id)s
                  AND r.decomposed_at IS NOT NULL AND r.paused_at IS NULL
                  AND r.cancelled_at IS NULL)
    ORDER BY i.id
    FOR UPDATE SKIP LOCKED)
UPDATE wl_items SET
    state = 'claimed',
    started_at = NULL,
    not_before = NULL,
    held_until = NULL,
    lease_token = COALESCE(%(token)s::bigint, (SELECT value FROM token)),
    holder = %(holder)s,
    lease_until = now() + make_interval(secs => %(lease)s::float8),
    updated_at = now()
WHERE wl_items.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING wl_items.id, wl_items.run_id, wl_items.stage, wl_items.seq, wl_items.key,
          wl_items.data, wl_items.attempts, wl_items.lease_token, wl_items.error;

-- name: limit_lock
-- A limited stage's bucket, locked for the claim transaction before any item row (the lock
-- order of docs/design.md): every claimer of the stage, on every machine, waits here for the
-- one before it. Its time is the database's clock, read after the lock was granted.
SELECT tokens, EXTRACT(EPOCH FROM clock_timestamp() - refreshed_at)::float8 AS elapsed
FROM wl_stage_limits WHERE job = %(job)s AND stage = %(stage)s
FOR UPDATE;

-- name: limit_create
-- The first claim of a limited stage makes its bucket, full.
INSERT INTO wl_stage_limits (job, stage, tokens, refreshed_at, rate, burst, max_in_flight)
VALUES (%(job)s, %(stage)s, %(burst)s, clock_timestamp(), %(rate)s, %(burst)s,
        %(max_in_flight)s)
ON CONFLICT (job, stage) DO NOTHING;

-- name: limit_spend
-- What is left of the bucket after a claim that took items; a claim that took none writes
-- nothing, so waiting for a token costs the disk nothing. refreshed_at is read now, after the
-- claim: refill is counted from later than the tokens were, never from earlier.
UPDATE wl_stage_limits SET tokens = %(tokens)s, refreshed_at = clock_timestamp(),
    rate = %(rate)s, burst = %(burst)s, max_in_flight = %(max_in_flight)s
WHERE job = %(job)s AND stage = %(stage)s;

-- name: limit_in_flight
-- The stage's claimed items over the job's open runs (a complete run holds none): what a cap
-- counts. Read after the bucket's lock, so it sees every claim committed before this one.
SELECT COALESCE(sum(c.n), 0)::bigint FROM wl_stage_counts AS c
WHERE c.stage = %(stage)s AND c.state = 'claimed'
  AND c.run_id IN (SELECT r.id FROM wl_runs AS r
                   WHERE r.job = %(job)s AND r.completed_at IS NULL);

-- name: events_add_now
-- events_add at the statement's own time, not the transaction's start: a limited claim's
-- 'claimed' events say when its bucket was spent, after the wait for its lock.
-- Only while the run exists, as events_add.
INSERT INTO wl_events (at, run_id, item_id, kind, lease_token, actor, detail)
SELECT clock_timestamp(), %(run_id)s::bigint, %(item_id)s::bigint, %(kind)s::text,
       %(lease_token)s::bigint, %(actor)s::text, %(detail)s::jsonb
FROM wl_runs WHERE id = %(run_id)s::bigint FOR KEY SHARE;

-- name: items_mark_started
-- Just before a handler runs, where its start must be known (a stage that is not
-- idempotent, see migration 0004); an item run alone after its holder vanished is also
-- charged its attempt here (charge 1), before it starts.
UPDATE wl_items SET attempts = attempts + %(charge)s, started_at = now(), updated_at = now()
WHERE id = ANY (%(ids)s::bigint[]) AND lease_token = %(token)s AND state COLLATE "C" = 'claimed'
RETURNING id;

-- name: items_heartbeat
UPDATE wl_items SET lease_until = now() + make_interval(secs => %(lease)s::float8)
WHERE id = ANY (%(ids)s::bigint[]) AND lease_token = %(token)s AND state COLLATE "C" = 'claimed';

-- name: items_release
-- moves: claimed -> pending
UPDATE wl_items SET state = 'pending', lease_until = NULL, updated_at = now()
WHERE id = ANY (%(ids)s::bigint[]) AND lease_token = %(token)s AND state COLLATE "C" = 'claimed'
RETURNING stage;

-- name: items_finish_if_leased
-- moves: claimed -> processed, failed, skipped, pending, unknown
-- The fenced completion of a chunk: a row changes only while it is still claimed under the token
-- the worker holds. The outcomes arrive as parallel arrays.
UPDATE wl_items SET
    state = f.state,
    result = f.result::jsonb,
    error = f.error,
    attempts = wl_items.attempts + f.charge,
    lease_until = NULL,
    not_before = CASE WHEN f.delay IS NULL THEN NULL
                 ELSE now() + make_interval(secs => f.delay) END,
    updated_at = now()
FROM unnest(%(ids)b::bigint[], %(tokens)b::bigint[], %(states)b::text[], %(results)b::text[],
            %(errors)b::text[], %(delays)b::float8[], %(charges)b::int[])
     AS f (id, token, state, result, error, delay, charge)
WHERE wl_items.id = f.id AND wl_items.lease_token = f.token
  AND wl_items.state COLLATE "C" = 'claimed'  -- by primary key: see items_finish_group
RETURNING wl_items.id, wl_items.stage;

-- name: items_finish_group
-- moves: claimed -> processed, failed, skipped, pending, unknown
-- The same fenced completion for items that share one outcome (most chunks): an id array and
-- one value per column. Used for a single shape per chunk, so rows lock in id order.
-- The rows are fetched by primary key, never through wl_items_leased: with stale statistics the
-- planner takes that index for small and walks every claimed row of every run (and, without
-- vacuum, every row ever claimed). `state COLLATE "C"` is the same test, written so that it
-- does not match the index's predicate.
UPDATE wl_items SET
    state = %(state)s,
    result = %(result)s::jsonb,
    error = %(error)s,
    attempts = attempts + %(charge)s,
    lease_until = NULL,
    not_before = CASE WHEN %(delay)s::float8 IS NULL THEN NULL
                 ELSE now() + make_interval(secs => %(delay)s::float8) END,
    updated_at = now()
WHERE id = ANY (%(ids)s::bigint[]) AND lease_token = %(token)s
  AND state COLLATE "C" = 'claimed'
RETURNING id, stage;

-- name: items_handoff
-- moves: (none) -> pending
-- redispatch_at is copied: a hand-off row is owed a message as its previous row was (0007);
-- so is the concurrency key: a unit's later stages keep its first stage's (0017)
INSERT INTO wl_items (run_id, stage, seq, key, data, redispatch_at, concurrency_key)
SELECT i.run_id, h.stage, i.seq, i.key, i.data, i.redispatch_at, i.concurrency_key
FROM unnest(%(ids)s::bigint[], %(stages)s::text[]) AS h (id, stage)
JOIN wl_items AS i ON i.id = h.id
WHERE i.id = ANY (%(ids)s::bigint[])  -- lets the planner fetch by primary key, never scan
ON CONFLICT (run_id, stage, seq) DO NOTHING
RETURNING run_id, stage;

-- name: items_list
SELECT * FROM wl_items
WHERE run_id = %(run_id)s AND id > %(after_id)s
  AND (%(stage)s::text IS NULL OR stage = %(stage)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(seq)s::bigint IS NULL OR seq = %(seq)s::bigint)
ORDER BY id LIMIT %(limit)s;

-- name: items_count
-- How many more items_list would find after an id: what a listing cut short says.
SELECT count(*) FROM wl_items
WHERE run_id = %(run_id)s AND id > %(after_id)s
  AND (%(stage)s::text IS NULL OR stage = %(stage)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text);

-- name: leases_reclaim_expired
-- moves: claimed -> pending, unknown
-- A lease that ran out is taken back only if its holder's session is gone too (migration 0008):
-- a worker stopped (SIGSTOP, a pause) past its lease keeps its session and its items.
WITH live AS MATERIALIZED (
    SELECT objid FROM pg_locks
    WHERE locktype = 'advisory' AND classid = %(holder_lock)s::oid AND objsubid = 2 AND granted),
picked AS (
    SELECT i.id FROM wl_items AS i
    JOIN wl_runs AS r ON r.id = i.run_id
    WHERE i.state = 'claimed' AND i.lease_until < now()
      AND (i.holder IS NULL OR hashtext(current_schema() || '/' || i.holder)::oid
           NOT IN (SELECT objid FROM live))
      AND r.job = %(job)s AND i.stage = %(stage)s
    LIMIT %(limit)s
    FOR UPDATE OF i SKIP LOCKED)
UPDATE wl_items SET
    -- an item whose handler never started under this claim cannot have had an effect
    state = CASE WHEN started_at IS NULL THEN 'pending' ELSE %(to_state)s::text END,
    error = CASE WHEN started_at IS NULL AND %(to_state)s::text <> 'pending'
            THEN %(unstarted)s
            -- a suspect of an idempotent stage: lost again while started, it runs alone next
            -- time; not started under this claim, it stays what it was
            WHEN %(to_state)s::text = 'pending' AND error LIKE 'lease_expired%%'
            THEN CASE WHEN started_at IS NULL THEN error ELSE %(again)s END
            ELSE %(reason)s END,
    lease_until = NULL,
    updated_at = now()
FROM picked
WHERE wl_items.id = picked.id
RETURNING wl_items.*;

-- name: outlook
-- Two branches so each can use its partial index instead of scanning every row of the table.
SELECT
    count(*) FILTER (WHERE state = 'pending' AND (not_before IS NULL OR not_before <= now()))
        AS ready,
    count(*) FILTER (WHERE state = 'pending' AND not_before > now()) AS waiting,
    EXTRACT(EPOCH FROM min(not_before - now()) FILTER (WHERE state = 'pending'
                                                       AND not_before > now())) AS next_ready_in,
    count(*) FILTER (WHERE state = 'claimed' AND lease_until >= now()) AS leased,
    EXTRACT(EPOCH FROM min(lease_until - now()) FILTER (WHERE state = 'claimed'
                                                        AND lease_until >= now())) AS lease_ends_in,
    count(*) FILTER (WHERE state = 'claimed' AND lease_until < now()) AS expired
FROM (
    SELECT state, not_before, lease_until FROM wl_items
    WHERE run_id = ANY (%(run_ids)s::bigint[]) AND state = 'pending'
    UNION ALL
    SELECT state, not_before, lease_until FROM wl_items
    WHERE run_id = ANY (%(run_ids)s::bigint[]) AND state = 'claimed'
) AS open_items;

-- name: events_add
-- Only while the run exists: a write that arrives after its run was pruned (a stale finish,
-- an ack, a sweeper's note) would leave an event nothing ever removes. KEY SHARE holds the
-- run row until this transaction commits, so a prune's delete of it waits and then deletes
-- this event with the others, and an insert after the delete finds no row and writes nothing.
-- It conflicts only with a delete and with reconcile's FOR UPDATE, which locks no item and
-- takes the counter rows after the run row, as every writer does (lock order, design.md).
INSERT INTO wl_events (run_id, item_id, kind, lease_token, actor, detail)
SELECT %(run_id)s::bigint, %(item_id)s::bigint, %(kind)s::text, %(lease_token)s::bigint,
       %(actor)s::text, %(detail)s::jsonb
FROM wl_runs WHERE id = %(run_id)s::bigint FOR KEY SHARE;

-- name: events_list
SELECT * FROM wl_events
WHERE run_id = %(run_id)s AND (%(item_id)s::bigint IS NULL OR item_id = %(item_id)s::bigint)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY id;

-- name: items_settle
-- moves: unknown -> processed, failed, pending, unknown; failed -> pending
-- An operator's or the sweeper's move, guarded by the state the item is moved from.
UPDATE wl_items SET
    state = f.state,
    result = COALESCE(f.result::jsonb, wl_items.result),
    error = f.error,
    attempts = CASE WHEN f.reset THEN 0 ELSE wl_items.attempts END,
    lease_until = NULL,
    not_before = CASE WHEN f.delay IS NULL THEN NULL
                 ELSE now() + make_interval(secs => f.delay) END,
    updated_at = now()
FROM unnest(%(ids)s::bigint[], %(states)s::text[], %(results)s::text[], %(errors)s::text[],
            %(delays)s::float8[], %(resets)s::boolean[])
     AS f (id, state, result, error, delay, reset)
WHERE wl_items.id = f.id AND wl_items.state = %(from_state)s AND wl_items.run_id = %(run_id)s
RETURNING wl_items.id, wl_items.stage;

-- name: items_keys
SELECT seq, key FROM wl_items
WHERE run_id = %(run_id)s AND stage = %(stage)s AND seq >= %(lo)s AND seq < %(hi)s;

-- name: items_attention
SELECT * FROM wl_items
WHERE state IN ('failed', 'unknown') AND state = ANY (%(states)s::text[])
  AND id > %(after_id)s
ORDER BY id LIMIT %(limit)s;

-- name: leases_expired
-- What leases_reclaim_expired would take back: run out, and its holder's session gone.
WITH live AS MATERIALIZED (
    SELECT objid FROM pg_locks
    WHERE locktype = 'advisory' AND classid = %(holder_lock)s::oid AND objsubid = 2 AND granted)
SELECT * FROM wl_items
WHERE state = 'claimed' AND lease_until < now() AND id > %(after_id)s
  AND (holder IS NULL OR hashtext(current_schema() || '/' || holder)::oid
       NOT IN (SELECT objid FROM live))
ORDER BY id LIMIT %(limit)s;

-- name: audit_attention
-- The failed and unknown items an audit lists: of one run, of one job's runs, changed since.
SELECT * FROM wl_items
WHERE state IN ('failed', 'unknown')
  AND (%(run_id)s::bigint IS NULL OR run_id = %(run_id)s::bigint)
  AND (%(job)s::text IS NULL OR run_id IN (SELECT id FROM wl_runs WHERE job = %(job)s::text))
  AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s::timestamptz)
  AND id > %(after_id)s
ORDER BY id LIMIT %(limit)s;

-- name: audit_expired
-- The claimed items whose lease ran out that an audit lists, filtered as audit_attention.
SELECT * FROM wl_items
WHERE state = 'claimed' AND lease_until < now()
  AND (%(run_id)s::bigint IS NULL OR run_id = %(run_id)s::bigint)
  AND (%(job)s::text IS NULL OR run_id IN (SELECT id FROM wl_runs WHERE job = %(job)s::text))
  AND (%(since)s::timestamptz IS NULL OR lease_until >= %(since)s::timestamptz)
  AND id > %(after_id)s
ORDER BY id LIMIT %(limit)s;

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
      <= now() - make_interval(secs => %(grace)s::float8)
  AND (%(backoff)s::float8 <= 0 OR r.error IS NULL OR COALESCE((
      SELECT max(e.at) <= now() - make_interval(secs => LEAST(
                 %(backoff)s::float8 * power(2, GREATEST(LEAST(count(*) - 1, 16), 0)), 3600))
      FROM wl_events AS e WHERE e.run_id = r.id AND e.kind = 'decomposition_failed'), true))
ORDER BY id;

-- name: run_insert_deferred
-- submit with conn=: the run row, written on the caller's connection in the caller's
-- transaction and marked deferred, so that the first worker or sweeper to see it after the
-- commit takes its decomposition (run_take_deferred).
INSERT INTO wl_runs (job, idempotency_key, payload, tolerate, priority, tenant, closing, deferred_at)
VALUES (%(job)s, %(key)s, %(payload)s::jsonb, %(tolerate)s::float8, %(priority)s::integer,
        %(tenant)s::text, %(closing)s::boolean,
        now())
ON CONFLICT (job, idempotency_key) DO NOTHING
RETURNING id;

-- name: run_by_key_in
-- run_by_key on the caller's connection, whose JSON decoding is its own (Django's loads jsonb
-- as text, say): the payload as text, decoded by us.
SELECT id, job, idempotency_key, NULL AS payload, payload::text AS payload_text, created_at,
       decomposed_at, completed_at, paused_at, cancelled_at, error, total, processed, failed,
       skipped, tolerate, priority, tenant
FROM wl_runs WHERE job = %(job)s AND idempotency_key = %(key)s;

-- name: ledger_identity
-- Which ledger a connection is on: the server (its start time), the database, and the
-- wl_runs table its search_path names. The caller's must be the ledger's.
SELECT (SELECT oid FROM pg_database WHERE datname = current_database())::bigint AS database_oid,
       current_database() AS database, current_schema() AS schema,
       to_regclass('wl_runs')::oid::bigint AS runs_table,
       pg_postmaster_start_time() AS server_started;

-- name: runs_deferred
-- Deferred runs no decomposer has taken yet, of the given jobs (NULL: of every job, for
-- audit), oldest first, through their own partial index; without payloads.
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs
WHERE deferred_at IS NOT NULL AND cancelled_at IS NULL
  AND (%(jobs)s::text[] IS NULL OR job = ANY (%(jobs)s::text[]))
ORDER BY id LIMIT %(limit)s;

-- name: run_take_deferred
-- A worker or sweeper takes a deferred run's decomposition: guarded by the mark, so of two
-- takers one gets the row (with its payload) and the other nothing.
UPDATE wl_runs SET deferred_at = NULL
WHERE id = %(run_id)s AND deferred_at IS NOT NULL AND decomposed_at IS NULL
  AND cancelled_at IS NULL
RETURNING *;

-- name: runs_to_close
SELECT r.id FROM wl_runs AS r
WHERE r.completed_at IS NOT NULL AND r.cancelled_at IS NULL AND r.job = ANY (%(jobs)s::text[])
  AND NOT EXISTS (SELECT 1 FROM wl_items AS i WHERE i.run_id = r.id AND i.stage = %(stage)s
                  AND i.state IN ('processed', 'failed', 'skipped', 'unknown'))
ORDER BY r.id;

-- name: run_pause
UPDATE wl_runs SET paused_at = now()
WHERE id = %(run_id)s AND paused_at IS NULL AND cancelled_at IS NULL
RETURNING id;

-- name: run_resume
UPDATE wl_runs SET paused_at = NULL WHERE id = %(run_id)s AND paused_at IS NOT NULL
RETURNING id;

-- name: run_cancel
UPDATE wl_runs SET cancelled_at = now()
WHERE id = %(run_id)s AND cancelled_at IS NULL
RETURNING id;

-- name: items_pending_history
-- Before a cancel skips a run's pending items: those with a reason or attempts, whose previous
-- values the cancel's events keep (locked, so what the events say is what the cancel overwrote).
SELECT id, stage, error, attempts FROM wl_items
WHERE run_id = %(run_id)s AND state = 'pending' AND (error IS NOT NULL OR attempts > 0)
ORDER BY id
FOR UPDATE;

-- name: items_cancel_pending
-- moves: pending -> skipped
UPDATE wl_items SET state = 'skipped', error = 'cancelled', updated_at = now()
WHERE run_id = %(run_id)s AND state = 'pending'
RETURNING id, stage;

-- name: run_lock
-- Reconcile holds the run row while it counts, so no completion's counter update lands in between.
SELECT id, job, idempotency_key, NULL AS payload, created_at, decomposed_at, completed_at,
       paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs WHERE id = %(run_id)s FOR UPDATE;

-- name: run_set_projection
UPDATE wl_runs SET total = %(total)s, processed = %(processed)s, failed = %(failed)s,
    skipped = %(skipped)s,
    completed_at = CASE WHEN %(complete)s::boolean THEN COALESCE(completed_at, now()) END
WHERE id = %(run_id)s;

-- Reads for the HTTP layer and metrics, and retention (prune). Listings leave the payload out.

-- name: runs_page
-- A page of runs, newest first, below a keyset cursor.
SELECT id, job, idempotency_key, NULL::jsonb AS payload, created_at, decomposed_at,
       completed_at, paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs
WHERE id < %(before)s AND (%(job)s::text IS NULL OR job = %(job)s::text)
ORDER BY id DESC LIMIT %(limit)s;

-- name: runs_open
-- Runs not complete: metrics derive each one's state.
SELECT id, job, idempotency_key, NULL::jsonb AS payload, created_at, decomposed_at,
       completed_at, paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
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
SELECT r.job, c.stage, c.state, sum(c.n)::bigint AS n
FROM wl_stage_counts AS c JOIN wl_runs AS r ON r.id = c.run_id
WHERE r.completed_at IS NULL AND c.n <> 0
GROUP BY r.job, c.stage, c.state ORDER BY 1, 2, 3;

-- name: pending_heads
-- The age in seconds of the oldest pending item per stage among the %(window)s ids from the
-- run's first pending item (the one workers claim next): bounded by an id range, whatever
-- plan stale statistics give (min(id) is one step down the claim index).
SELECT stage, EXTRACT(EPOCH FROM now() - min(updated_at))::float8 AS age
FROM wl_items
WHERE run_id = %(run_id)s AND state = 'pending'
  AND id >= (SELECT min(id) FROM wl_items WHERE run_id = %(run_id)s AND state = 'pending')
  AND id < (SELECT min(id) FROM wl_items WHERE run_id = %(run_id)s AND state = 'pending')
           + %(window)s
GROUP BY stage ORDER BY stage;

-- name: attention_totals
SELECT
    (SELECT count(*) FROM wl_items WHERE state = 'claimed' AND lease_until < now()),
    (SELECT count(*) FROM wl_items WHERE state IN ('failed', 'unknown') AND state = 'unknown'),
    (SELECT count(*) FROM wl_items WHERE state IN ('failed', 'unknown') AND state = 'failed');

-- name: run_attention
-- A run's failed or unknown items through the attention index (never a walk of the run):
-- `run_id + 0` keeps the planner off the run's unique index, which stale statistics favour.
SELECT * FROM wl_items
WHERE state IN ('failed', 'unknown') AND state = %(state)s AND run_id + 0 = %(run_id)s
  AND id > %(after_id)s AND (%(stage)s::text IS NULL OR stage = %(stage)s::text)
ORDER BY id LIMIT %(limit)s;

-- name: run_attention_reasons
-- Why a run's items failed (or are unknown): the first %(window)s of them, grouped by reason.
SELECT stage, error, count(*) AS n, min(seq) AS first_seq
FROM (SELECT stage, error, seq FROM wl_items
      WHERE state IN ('failed', 'unknown') AND state = %(state)s AND run_id + 0 = %(run_id)s
      ORDER BY id LIMIT %(window)s) AS a
GROUP BY stage, error ORDER BY n DESC, stage, error LIMIT %(groups)s;

-- name: run_skip_reasons
-- Why a run's items were skipped: the first %(window)s found, grouped by reason (no index has
-- skipped items, so this walks the run until it has found them).
SELECT stage, error, count(*) AS n, min(seq) AS first_seq
FROM (SELECT stage, error, seq FROM wl_items
      WHERE run_id = %(run_id)s AND state = 'skipped' LIMIT %(window)s) AS a
GROUP BY stage, error ORDER BY n DESC, stage, error LIMIT %(groups)s;

-- name: items_by_key
SELECT * FROM wl_items
WHERE run_id = %(run_id)s AND key = %(key)s AND id > %(after_id)s
  AND (%(stage)s::text IS NULL OR stage = %(stage)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
ORDER BY id LIMIT %(limit)s;

-- name: events_page
SELECT * FROM wl_events WHERE run_id = %(run_id)s AND id > %(after_id)s ORDER BY id
LIMIT %(limit)s;

-- name: runs_prunable
-- Runs complete (a cancelled run whose items are all terminal is) before the cutoff.
SELECT id, job, idempotency_key, NULL::jsonb AS payload, created_at, decomposed_at,
       completed_at, paused_at, cancelled_at, error, total, processed, failed, skipped, tolerate, priority, tenant
FROM wl_runs
WHERE completed_at IS NOT NULL
  AND completed_at < now() - make_interval(secs => %(cutoff)s::float8)
  AND (%(job)s::text IS NULL OR job = %(job)s::text) AND id > %(after_id)s
ORDER BY id LIMIT %(limit)s;

-- name: run_prune
-- The first step of pruning a run: its row goes, checked again against the cutoff and its
-- items (none may be pending, claimed or unknown). Its items, events and counts follow.
DELETE FROM wl_runs
WHERE id = %(run_id)s AND completed_at IS NOT NULL
  AND completed_at < now() - make_interval(secs => %(cutoff)s::float8)
  AND NOT EXISTS (SELECT 1 FROM wl_items WHERE run_id = %(run_id)s
                  AND state IN ('pending', 'claimed', 'unknown'))
  AND NOT (closing IS TRUE AND cancelled_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM wl_items WHERE run_id = %(run_id)s
                           AND stage = '@close' AND state IN ('processed', 'failed', 'skipped')))
RETURNING id;

-- name: runs_unclosed
-- Of these runs, those recorded with a closing hook (migration 0012) that has not run yet:
-- not cancelled, and no terminal (or unknown) @close entry. prune keeps them, and says why.
SELECT r.id FROM wl_runs AS r
WHERE r.id = ANY (%(run_ids)s::bigint[]) AND r.closing IS TRUE AND r.cancelled_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM wl_items AS i WHERE i.run_id = r.id AND i.stage = '@close'
                  AND i.state IN ('processed', 'failed', 'skipped', 'unknown'))
ORDER BY r.id;

-- name: items_prune
-- One bounded batch of a pruned run's items (its run row is gone: nothing else moves them).
DELETE FROM wl_items
WHERE id = ANY (ARRAY(SELECT id FROM wl_items WHERE run_id = %(run_id)s LIMIT %(limit)s))
  AND NOT EXISTS (SELECT 1 FROM wl_runs WHERE id = %(run_id)s)
RETURNING stage, state;

-- name: events_prune
DELETE FROM wl_events
WHERE id = ANY (ARRAY(SELECT id FROM wl_events WHERE run_id = %(run_id)s LIMIT %(limit)s))
  AND NOT EXISTS (SELECT 1 FROM wl_runs WHERE id = %(run_id)s)
RETURNING id;

-- name: counts_prune
-- The last step: the counters of a pruned run once it has no item left. Until then these rows
-- mark a prune that stopped part-way (runs_orphaned).
DELETE FROM wl_stage_counts
WHERE run_id = %(run_id)s AND NOT EXISTS (SELECT 1 FROM wl_items WHERE run_id = %(run_id)s)
  AND NOT EXISTS (SELECT 1 FROM wl_runs WHERE id = %(run_id)s);

-- name: runs_orphaned
SELECT DISTINCT run_id FROM wl_stage_counts AS c
WHERE NOT EXISTS (SELECT 1 FROM wl_runs AS r WHERE r.id = c.run_id)
ORDER BY run_id;

-- Dispatch through a broker (docs/design.md, "Dispatch through a broker"; migration 0007).

-- name: items_claim_by_identity
-- moves: pending -> claimed
-- A broker task's claim: exactly the items its message names (one run, one stage, some seqs),
-- found through the unique (run_id, stage, seq) index, so it costs O(seqs) at any run size
-- (state COLLATE "C": the planner never walks wl_items_claimable for it). Only items still
-- pending and due in a run of the message's job, decomposed, not paused, not cancelled (a
-- message naming another job's run claims nothing), locked in id order with SKIP
-- LOCKED: a copy of a message already claimed (or being claimed) finds nothing. One token for
-- the claim, taken only when it finds rows. redispatch_at becomes the claim's time: the item
-- is owed a message as soon as it is pending again (a retry, a release, an expired lease).
-- The token: the server's timeline in its high bits (docs/design.md, "Fencing: one token per claim"), so a
-- promoted standby, whose sequence may hand out a lost window's values again, never gives
-- out a token of the old timeline.
WITH token AS (SELECT (('x' || left(pg_walfile_name(pg_current_wal_insert_lsn()), 8))
                           ::bit(32)::bigint << 40) + nextval('wl_lease_token_seq') AS value),
picked AS (
    SELECT i.id FROM wl_items AS i
    WHERE i.run_id = %(run_id)s AND i.stage = %(stage)s AND i.seq = ANY (%(seqs)s::bigint[])
      AND i.state COLLATE "C" = 'pending'
      AND (i.not_before IS NULL OR i.not_before <= now())
      -- not held for a later message (0013): held until the message's own hold at most
      AND (i.held_until IS NULL
           OR i.held_until <= greatest(now(), to_timestamp(%(held)s::float8 / 1000)))
      AND i.stage <> '@close'
      AND EXISTS (SELECT 1 FROM wl_runs AS r WHERE r.id = %(run_id)s AND r.job = %(job)s
                  AND r.decomposed_at IS NOT NULL AND r.paused_at IS NULL
                  AND r.cancelled_at IS NULL)
    -- no more than a limited stage's bucket and cap allow (all of them otherwise)
    ORDER BY i.id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
UPDATE wl_items SET
    state = 'claimed',
    started_at = NULL,
    -- a retry's backoff is served once it is claimed: a release or a reclaim
    -- makes it due at once (a time written by a clock ahead would stay)
    not_before = NULL,
    lease_token = (SELECT value FROM token),
    holder = %(holder)s,
    lease_until = now() + make_interval(secs => %(lease)s::float8),
    updated_at = now(),
    redispatch_at = now(),
    dispatches = 0,
    held_until = NULL
WHERE wl_items.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING wl_items.id, wl_items.run_id, wl_items.stage, wl_items.seq, wl_items.key,
          wl_items.data, wl_items.attempts, wl_items.lease_token, wl_items.error;

-- name: items_owe
-- Before a run dispatched through a broker is marked decomposed: a page (in id order) of its
-- first stage's pending rows owes a message from :wait seconds from now, in case the process
-- dies between the mark and the publish. Nothing of the run is claimable before the mark.
UPDATE wl_items SET
    redispatch_at = now() + make_interval(secs => %(wait)s::float8),
    dispatches = 1
WHERE id = ANY (ARRAY(SELECT id FROM wl_items
                      WHERE run_id = %(run_id)s AND state = 'pending' AND stage = %(stage)s
                        AND id > %(after_id)s
                      ORDER BY id LIMIT %(limit)s))
RETURNING id;

-- name: items_pending_seqs
-- A page (in id order) of a stage's pending items: what a decomposition's messages name.
SELECT id, seq FROM wl_items
WHERE run_id = %(run_id)s AND state = 'pending' AND stage = %(stage)s AND id > %(after_id)s
ORDER BY id LIMIT %(limit)s;

-- name: items_mark_dispatched
-- Just before their message is published: the items still pending owe the next one from
-- delay (a retry's backoff) plus wait * 2^(messages so far, at most 4) seconds from now.
-- Returns the seqs marked, which are the ones the message names.
UPDATE wl_items SET
    redispatch_at = now() + make_interval(
        secs => %(delay)s::float8 + %(wait)s::float8 * power(2, least(dispatches, 4))),
    dispatches = dispatches + 1
-- rows in id order (the lock order of every write of items), found by their identity
WHERE id = ANY (ARRAY(SELECT id FROM wl_items
                      WHERE run_id = %(run_id)s AND stage = %(stage)s
                        AND seq = ANY (%(seqs)s::bigint[])
                      ORDER BY id))
  AND state COLLATE "C" = 'pending'
RETURNING seq;

-- name: limit_horizon
-- A limited stage's bucket, locked by limit_lock in the same transaction: the database's time
-- and the bucket's reservation horizon (0013), as seconds since the epoch.
SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8 AS now,
       EXTRACT(EPOCH FROM held_until)::float8 AS held_until
FROM wl_stage_limits WHERE job = %(job)s AND stage = %(stage)s;

-- name: limit_hold
-- The bucket's refill is promised to held-back messages until :held (ms since the epoch).
UPDATE wl_stage_limits SET held_until = to_timestamp(%(held)s::float8 / 1000)
WHERE job = %(job)s AND stage = %(stage)s;

-- name: items_holdable
-- Of the items a broker task's limited claim left, those to hold back (0013): still pending,
-- due, of a claimable run of the job, and not held for a later message already (a copy of an
-- earlier message finds none), found by identity and locked in id order after the bucket.
SELECT i.id FROM wl_items AS i
WHERE i.run_id = %(run_id)s AND i.stage = %(stage)s AND i.seq = ANY (%(seqs)s::bigint[])
  AND i.state COLLATE "C" = 'pending'
  AND (i.not_before IS NULL OR i.not_before <= now())
  AND (i.held_until IS NULL
       OR i.held_until <= greatest(now(), to_timestamp(%(held)s::float8 / 1000)))
  AND i.stage <> '@close'
  AND EXISTS (SELECT 1 FROM wl_runs AS r WHERE r.id = %(run_id)s AND r.job = %(job)s
              AND r.decomposed_at IS NOT NULL AND r.paused_at IS NULL
              AND r.cancelled_at IS NULL)
ORDER BY i.id
FOR UPDATE OF i SKIP LOCKED;

-- name: items_hold
-- Held-back items, each held until its message's due time (ms since the epoch) and owed the
-- next message from then plus wait * 2^(messages so far, at most 4), as items_mark_dispatched.
UPDATE wl_items SET held_until = to_timestamp(h.due::float8 / 1000),
    redispatch_at = to_timestamp(h.due::float8 / 1000) + make_interval(
        secs => %(wait)s::float8 * power(2, least(dispatches, 4))),
    dispatches = dispatches + 1
FROM unnest(%(ids)s::bigint[], %(dues)s::bigint[]) AS h (id, due)
WHERE wl_items.id = h.id
RETURNING wl_items.id, wl_items.seq;

-- name: items_owed
-- The sweeper's re-dispatch: a run's pending items whose message is overdue (lost by the
-- broker, or never published), due themselves, oldest first; through wl_items_owed alone.
-- Every time is the server's (:wait, which SQLite's clocks need, is not asked for).
SELECT stage, seq FROM wl_items
WHERE run_id = %(run_id)s AND state = 'pending' AND redispatch_at IS NOT NULL
  AND redispatch_at <= now()
  AND (not_before IS NULL OR not_before <= now())
  AND stage <> '@close'
ORDER BY redispatch_at LIMIT %(limit)s;

-- == schedules and deadlines (migration 0014; docs/design.md, "Schedules and deadlines") ======

-- name: db_now
SELECT now() AS now;

-- name: schedule_declare
-- A new schedule starts at its first planned time after now; a changed spec, time zone or job
-- starts again from now; an unchanged declaration keeps where it is (a restart catches up).
INSERT INTO wl_schedules (name, job, spec, tz, next_fire_at)
VALUES (%(name)s, %(job)s, %(spec)s, %(tz)s, %(next_at)s::timestamptz)
ON CONFLICT (name) DO UPDATE SET job = excluded.job, spec = excluded.spec, tz = excluded.tz,
    next_fire_at = excluded.next_fire_at, updated_at = now()
WHERE wl_schedules.spec <> excluded.spec OR wl_schedules.tz <> excluded.tz
   OR wl_schedules.job <> excluded.job;

-- name: schedule_declare_new
-- The CLI's and the API's declarations: only a schedule never recorded (their app may be older
-- than the workers').
INSERT INTO wl_schedules (name, job, spec, tz, next_fire_at)
VALUES (%(name)s, %(job)s, %(spec)s, %(tz)s, %(next_at)s::timestamptz)
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
-- read it moves it on, in the transaction that records the firing (a second sweeper's UPDATE
-- waits for the first one's row lock and then finds another value).
UPDATE wl_schedules SET next_fire_at = %(next_at)s::timestamptz, missed = missed + %(missed)s,
    updated_at = now()
WHERE name = %(name)s AND next_fire_at = %(expected)s::timestamptz AND paused_at IS NULL;

-- name: schedule_take_waiting
UPDATE wl_schedules SET waiting_fire_at = NULL, updated_at = now()
WHERE name = %(name)s AND waiting_fire_at = %(expected)s::timestamptz AND paused_at IS NULL;

-- name: schedule_wait
UPDATE wl_schedules SET waiting_fire_at = %(fire_at)s::timestamptz
WHERE name = %(name)s AND waiting_fire_at IS NULL;

-- name: schedule_open_run
-- An earlier run of the schedule that is not complete: among its job's open runs only.
SELECT r.id FROM wl_runs AS r
JOIN wl_firings AS f ON f.run_id = r.id AND f.schedule = %(name)s AND f.state = 'submitted'
WHERE r.job = %(job)s AND r.completed_at IS NULL AND r.cancelled_at IS NULL
ORDER BY r.id LIMIT 1;

-- name: firing_get
SELECT schedule, fire_at, state, run_id, error, attempts, actor, recorded_at
FROM wl_firings WHERE schedule = %(name)s AND fire_at = %(fire_at)s::timestamptz;

-- name: firing_record
-- A firing is recorded once; only a failed one (tried again) or a waiting one (its run now
-- submitted) is written over.
INSERT INTO wl_firings (schedule, fire_at, state, run_id, error, attempts, actor)
VALUES (%(name)s, %(fire_at)s::timestamptz, %(state)s, %(run_id)s, %(error)s, 1, %(actor)s)
ON CONFLICT (schedule, fire_at) DO UPDATE SET state = excluded.state, run_id = excluded.run_id,
    error = excluded.error, actor = excluded.actor,
    attempts = wl_firings.attempts + (CASE WHEN wl_firings.state = 'failed' THEN 1 ELSE 0 END),
    recorded_at = now()
WHERE wl_firings.state IN ('failed', 'waiting');

-- name: firings_list
SELECT schedule, fire_at, state, run_id, error, attempts, actor, recorded_at
FROM wl_firings WHERE schedule = %(name)s ORDER BY fire_at DESC LIMIT %(limit)s;

-- name: firings_failed
SELECT schedule, fire_at, state, run_id, error, attempts, actor, recorded_at
FROM wl_firings WHERE state = 'failed' ORDER BY schedule, fire_at LIMIT %(limit)s;

-- name: schedule_pause
UPDATE wl_schedules SET paused_at = now(), paused_by = %(actor)s, updated_at = now()
WHERE name = %(name)s AND paused_at IS NULL;

-- name: schedule_resume
UPDATE wl_schedules SET paused_at = NULL, paused_by = %(actor)s, updated_at = now()
WHERE name = %(name)s AND paused_at IS NOT NULL;

-- name: run_set_deadline
-- A deadline given as a time (deadline_at) or as seconds after submission (deadline_in); the
-- warning starts warn_before seconds (NULL: no warning) before it.
UPDATE wl_runs SET
    deadline_at = COALESCE(%(deadline_at)s::timestamptz,
                           created_at + make_interval(secs => %(deadline_in)s::float8)),
    warn_at = COALESCE(%(deadline_at)s::timestamptz,
                       created_at + make_interval(secs => %(deadline_in)s::float8))
              - make_interval(secs => %(warn_before)s::float8)
WHERE id = %(run_id)s;

-- name: runs_mark_deadline_missed
-- Open runs past their deadline not yet noted: noted once (an event each, same transaction).
UPDATE wl_runs SET deadline_missed_at = now()
WHERE id IN (SELECT id FROM wl_runs
             WHERE deadline_at IS NOT NULL AND completed_at IS NULL AND cancelled_at IS NULL
               AND deadline_missed_at IS NULL AND deadline_at < now()
             ORDER BY deadline_at LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED)
RETURNING id, job, idempotency_key, deadline_at, total, processed, failed, skipped;

-- name: runs_deadlines
-- Open runs past their deadline or inside its warning, with the database's now.
SELECT id, job, idempotency_key, deadline_at, warn_at, total, processed, failed, skipped,
       now() AS now
FROM wl_runs
WHERE deadline_at IS NOT NULL AND completed_at IS NULL AND cancelled_at IS NULL
  AND (deadline_at <= now() OR warn_at <= now())
ORDER BY deadline_at LIMIT %(limit)s;
