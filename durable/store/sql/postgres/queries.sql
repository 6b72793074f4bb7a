-- Named queries of the PostgreSQL store. Each claim and state change is one statement.
-- Parameters are psycopg's %(name)s. %(now)s is the time: the store replaces it with
-- SERVER_NOW (durable/store/_postgres.py), the server's statement_timestamp() unless a clock
-- was injected (tests), whose time is then passed.
-- A fenced statement holds only while the run is running under the attempt's epoch and its
-- lease has not expired. Fence checks that do not update the run lock it (FOR NO KEY
-- UPDATE), so a concurrent recovery or claim waits for them and then sees their writes:
-- per run, journal writers are serialized and journal order is commit order.
-- Journal entries of one call travel as parallel arrays (%(kinds)s, %(steps)s, ...) and are
-- inserted in their order by one statement.
-- A statement that ends a run (finish, a release or cancel that ends it cancelled) also
-- sends NOTIFY durable_done, '<schema> <the run's row as JSON>' (%(schema)s; '<schema>
-- {"id": <run id>}' when the row does not fit in a NOTIFY: done_payload): delivered when it
-- commits, to the waits of other processes (Store.wait_for_finished), with no statement of
-- its own. It returns the run's row, which the store hands to the waits of its own process.

-- name: done_payload
-- The payload of the durable_done NOTIFY of the run of the CTE run (schema 11): the run as
-- it ended, for the waits of other processes to take without reading it again, or its id
-- alone when that would not fit (a NOTIFY payload is under 8,000 bytes).
CASE WHEN octet_length(row_to_json(run)::text) < 7990 - octet_length(%(schema)s)
          THEN %(schema)s || ' ' || row_to_json(run)::text
          ELSE %(schema)s || ' ' || json_build_object('id', run.id)::text END

-- name: insert_run
-- run_at NULL: due at once, at the statement's time (the server's), which the entry's data
-- then gets in place of the null it starts with ({"run_at":null,...}): no round trip
-- before the insert to ask the server what time it is. An id that named a pruned run
-- (durable_pruned_runs) is not used again: nothing is inserted (the store says why).
WITH run AS (
    INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, epoch, attempt,
                              run_at, created_at, updated_at, timeout, start_within)
    SELECT %(id)s::text, %(workflow)s::text, %(args)s::text, %(key)s::text, 'queued', 0, 0,
           coalesce(%(run_at)s::double precision, %(now)s), %(now)s, %(now)s,
           %(timeout)s::double precision, %(start_within)s::double precision
    WHERE NOT EXISTS (SELECT 1 FROM durable_pruned_runs WHERE id = %(id)s::text)
    ON CONFLICT (id) DO NOTHING
    RETURNING *
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, at, data)
    SELECT id, 0, 'run_created', %(now)s,
           CASE WHEN %(run_at)s::double precision IS NULL
                THEN '{"run_at":' || run_at::text || substr(%(data)s, length('{"run_at":null') + 1)
                ELSE %(data)s END
    FROM run
)
-- txid: the transaction, which the durable_work NOTIFY names (PostgresStore.told_here)
SELECT run.*, txid_current() AS txid FROM run;

-- name: get_run
SELECT * FROM durable_runs WHERE id = %(id)s;

-- name: list_runs
-- The marker line below becomes the fragments runs_where_* of the filters given, joined
-- by AND (durable/store/_base.py, run_filters): one fixed statement per filter shape. Ids are
-- compared in code point order (COLLATE "C"), as in SQLite and in the indexes.
SELECT * FROM durable_runs
/*where*/
ORDER BY created_at DESC, id COLLATE "C" DESC
LIMIT %(limit)s;

-- name: list_unfinished
-- The queued and the running runs together, newest first, as list_runs pages them: one
-- statement, so one snapshot, and a run that moves between the two states meanwhile (a
-- claim, a release, a recovery) is read once, in one of them (Store.list_unfinished). Each
-- branch reads its state's range of an index in the list's order and stops at the page's
-- size; the page is the newest of the two (a Merge Append). The two markers become the
-- branches' WHERE clauses (list_unfinished_query in
-- durable/store/_base.py: the filters' fragments, runs_where_queued / runs_where_running
-- for the state, a literal each, so one statement holds both).
SELECT * FROM (
    (SELECT * FROM durable_runs
     /*queued*/
     ORDER BY created_at DESC, id COLLATE "C" DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT * FROM durable_runs
     /*running*/
     ORDER BY created_at DESC, id COLLATE "C" DESC LIMIT %(limit)s)) AS unfinished
ORDER BY created_at DESC, id COLLATE "C" DESC
LIMIT %(limit)s;

-- name: count_runs
SELECT state, count(*) AS n FROM durable_runs
/*where*/
GROUP BY state;

-- name: runs_where_state
state = %(state)s::text

-- name: runs_where_queued
state = 'queued'

-- name: runs_where_running
state = 'running'

-- name: runs_where_workflow
workflow = %(workflow)s::text

-- name: runs_where_workflow_of_key
workflow = %(workflow)s::text

-- name: runs_where_workflow_of_key_state
workflow = %(workflow)s::text

-- name: runs_where_key
concurrency_key = %(key)s::text

-- name: runs_where_before
-- the keyset cursor: strictly after the previous page's last run, in the sort's order
(created_at, id COLLATE "C") < (%(before_at)s::double precision, %(before_id)s::text)

-- name: runs_where_created_from
created_at >= %(created_from)s::double precision

-- name: runs_where_created_to
created_at < %(created_to)s::double precision

-- name: runs_where_id_prefix
-- a range in code point order (index durable_runs_id_c): no LIKE, no wildcards
id COLLATE "C" >= %(id_prefix)s::text AND id COLLATE "C" < %(id_prefix_end)s::text

-- name: runs_where_id_prefix_open
id COLLATE "C" >= %(id_prefix)s::text

-- name: latest_run
SELECT * FROM durable_runs
WHERE workflow = %(workflow)s AND concurrency_key = %(key)s
ORDER BY created_at DESC, id COLLATE "C" DESC
LIMIT 1;

-- name: next_run_at
SELECT min(run_at) AS run_at FROM durable_runs WHERE state = 'queued';

-- name: next_due
-- Seconds until the earliest queued run of the worker's workflows that is not due yet (a
-- delayed start, a released wait, a retry delay), by the server's clock: the worker wakes
-- then (Store.next_due_in). The partial queue index's range after now, in its order.
SELECT r.run_at - %(now)s AS due_in FROM durable_runs AS r
WHERE r.state = 'queued' AND r.run_at > %(now)s
  AND (%(workflows)s::text[] IS NULL OR r.workflow = ANY (%(workflows)s::text[]))
ORDER BY r.run_at
LIMIT 1;

-- name: queue_stats
-- The due queued runs per workflow, for metrics (durable/prometheus.py): a range of the
-- partial queue index (run_at, ...) WHERE state = 'queued'.
SELECT workflow, count(*) AS n, %(now)s - min(run_at) AS age FROM durable_runs
WHERE state = 'queued' AND run_at <= %(now)s
GROUP BY workflow;

-- name: claim
-- Candidates are locked with SKIP LOCKED, so competing workers take different runs without
-- waiting for each other. Which queued runs are candidates: claimable_where. The unique
-- index durable_runs_one_running_per_key settles the remaining races of keyed runs (the
-- store treats its violation as "claimed nothing").
WITH candidates AS (
    SELECT r.id FROM durable_runs AS r
    WHERE /*claimable*/
      AND (%(run_id)s::text IS NULL OR r.id = %(run_id)s::text)
    ORDER BY r.run_at, r.created_at, r.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE durable_runs AS d
    SET /*claimed*/
    FROM candidates AS c
    WHERE d.id = c.id AND d.state = 'queued'
    RETURNING d.*
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, attempt, at, data)
    SELECT id, epoch, 'run_claimed', attempt, %(now)s, %(data)s FROM claimed
)
-- One row at least: the statement's snapshot (what it saw) in each row, with the claimed
-- run's columns (NULL when it claimed nothing). A durable_work NOTIFY of a transaction this
-- snapshot saw announced nothing this claim did not see (PostgresStore.wait_for_work).
SELECT c.*, s.seen FROM (SELECT txid_current_snapshot()::text AS seen) AS s
LEFT JOIN claimed AS c ON true
ORDER BY c.run_at, c.created_at, c.id;

-- name: claim_set
-- What a claim sets (claim, claim_with).
state = 'running',
        -- a claim in a fencing scope (a key, or the run) follows the scope's previous claim's
        -- commit, so its nextval is above that claim's: strictly increasing per scope
        epoch = nextval('durable_epochs'),
        attempt = d.attempt + 1,
        worker = %(worker)s,
        lease_expires_at = %(now)s + %(lease)s,
        heartbeat_at = %(now)s,
        updated_at = %(now)s,
        waiting_for = NULL

-- name: claimable_where
-- Which queued runs a claim may take (claim, claim_with, claimable: one set of conditions).
-- A run with a concurrency key is a candidate only when no run of its key is running and it
-- is the first queued run of its key: a run that has started (released, recovered or
-- replayed: attempt > 0) comes first, then runs that never started, FIFO by run_at and
-- creation (an interrupted run keeps its key).
r.state = 'queued' AND r.run_at <= %(now)s
      AND (%(workflows)s::text[] IS NULL OR r.workflow = ANY (%(workflows)s::text[]))
      -- not of a paused workflow (migration 014): a lookup by primary key per candidate
      AND NOT EXISTS (SELECT 1 FROM durable_paused AS p WHERE p.workflow = r.workflow)
      AND (r.concurrency_key IS NULL OR (
            NOT EXISTS (SELECT 1 FROM durable_runs AS x
                        WHERE x.concurrency_key = r.concurrency_key AND x.state = 'running')
            AND r.id = (SELECT y.id FROM durable_runs AS y
                        WHERE y.concurrency_key = r.concurrency_key AND y.state = 'queued'
                        ORDER BY y.attempt = 0, y.run_at, y.created_at, y.id LIMIT 1)))

-- name: claimable
-- What claim would take now, by a read (no write, no lock): Store.claimable.
SELECT r.* FROM durable_runs AS r
WHERE /*claimable*/
ORDER BY r.run_at, r.created_at, r.id
LIMIT %(limit)s;

-- name: claim_with
-- Store.claim_with in one statement (one round trip, one commit): the carried finishes
-- (finishes, as finish_batch: each fenced on its own, a refused one changes nothing), the
-- claim of run :run_id (as claim, if a claim may still take it), its run_claimed entry and,
-- only when the claimed run has attempt number :attempt and no pending cancel (the run the
-- caller read), the attempt's first entries under its new epoch. The finished runs come back as rows with
-- their job (from 1), the claimed run as a row of job 0; each row says how many entries
-- were journaled for the claim (run_claimed included). The finishes and the claim touch
-- different runs (a run being finished is running, a claimed one queued) and the claim
-- waits for no lock (SKIP LOCKED); a keyed run whose key's running run finishes in this
-- statement is not claimable in it (the statement sees that run running), as it was not
-- when the caller read what to claim.
WITH /*finishes*/, candidate AS (
    SELECT r.id FROM durable_runs AS r
    WHERE r.id = %(run_id)s::text AND /*claimable*/
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE durable_runs AS d
    SET /*claimed*/
    FROM candidate AS c
    WHERE d.id = c.id AND d.state = 'queued'
    RETURNING d.*
), claim_journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
    SELECT c.id, c.epoch, e.kind, e.step, e.step_key, e.name,
           CASE WHEN e.ord = 0 THEN c.attempt ELSE e.attempt END, %(now)s, e.data
    FROM claimed AS c
    CROSS JOIN (SELECT 0::bigint, 'run_claimed', NULL::integer, NULL::text, NULL::text,
                       NULL::integer, %(data)s::text
                UNION ALL
                SELECT u.ord, u.kind, u.step, u.step_key, u.name, u.attempt, u.data
                FROM unnest(%(claim_kinds)s::text[], %(claim_steps)s::integer[],
                            %(claim_step_keys)s::text[], %(claim_names)s::text[],
                            %(claim_attempts)s::integer[], %(claim_datas)s::text[])
                     WITH ORDINALITY AS u(kind, step, step_key, name, attempt, data, ord))
         AS e(ord, kind, step, step_key, name, attempt, data)
    WHERE e.ord = 0 OR (c.attempt = %(attempt)s AND NOT c.cancel_requested)
    ORDER BY e.ord
    RETURNING 1
), written AS (
    SELECT count(*) AS n FROM claim_journaled
)
SELECT run.*, written.n AS written FROM run, written, notified
UNION ALL
SELECT 0::bigint, c.*, written.n FROM claimed AS c, written;

-- name: renew
-- The held runs are locked first, in id order, as by every statement that locks several
-- runs (append_batch, finish_batch): a renewal and a group-commit batch that share runs
-- cannot then each hold a row the other waits for (read by the runs' state index, the
-- update locked them in creation order, and the server aborted one of the two).
WITH held AS (
    SELECT d.id FROM durable_runs AS d
    JOIN unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS h(id, epoch)
      ON d.id = h.id AND d.epoch = h.epoch
    WHERE d.state = 'running' AND d.worker = %(worker)s AND d.lease_expires_at > %(now)s
    ORDER BY d.id
    FOR NO KEY UPDATE OF d
)
UPDATE durable_runs AS d
SET lease_expires_at = %(now)s + %(lease)s,
    heartbeat_at = %(now)s,
    heartbeat_detail = coalesce(%(details)s::jsonb ->> d.id, d.heartbeat_detail)
FROM held
WHERE d.id = held.id
RETURNING d.id, d.epoch, d.cancel_requested;

-- name: append_entries
WITH fence AS (
    SELECT id, epoch FROM durable_runs
    WHERE id = %(run_id)s AND epoch = %(epoch)s AND state = 'running'
      AND lease_expires_at > %(now)s
    FOR NO KEY UPDATE
)
INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
SELECT fence.id, fence.epoch, e.kind, e.step, e.step_key, e.name, e.attempt, %(now)s, e.data
FROM fence
CROSS JOIN unnest(%(kinds)s::text[], %(steps)s::integer[], %(step_keys)s::text[],
                  %(names)s::text[], %(attempts)s::integer[], %(datas)s::text[])
     WITH ORDINALITY AS e(kind, step, step_key, name, attempt, data, ord)
ORDER BY e.ord;

-- name: append_entry
-- A lone append of one entry (the usual: a step's entry): append_entries with scalars, as
-- one INSERT of a row selected from the locked run (no CTE, no unnest). The same fence and
-- the same row lock: FOR NO KEY UPDATE waits for a concurrent recovery or claim of the run
-- and re-checks the WHERE clause on the row's newest version, so a write behind a
-- recovery is refused (docs/postgres.md, *Why the row lock stays*). Less server work than
-- the CTE and unnest form (docs/postgres.md, *Group commit*).
INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
SELECT id, epoch, %(kinds)s::text, %(steps)s::integer, %(step_keys)s::text, %(names)s::text,
       %(attempts)s::integer, %(now)s, %(datas)s::text
FROM durable_runs
WHERE id = %(run_id)s AND epoch = %(epoch)s AND state = 'running'
  AND lease_expires_at > %(now)s
FOR NO KEY UPDATE;

-- name: append_entry_pair
-- A lone append of two entries (the usual in a sequential run: a step's deferred completion
-- with the next step's start): append_entry's one INSERT from the locked run row, the
-- entries as a VALUES list of scalars, in order (no CTE, no unnest, no arrays to dump).
-- The same fence and row lock (FOR NO KEY UPDATE OF the run's row; the VALUES list locks
-- nothing).
INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
SELECT r.id, r.epoch, e.kind, e.step, e.step_key, e.name, e.attempt, %(now)s, e.data
FROM durable_runs AS r
CROSS JOIN (VALUES (1, %(kind1)s::text, %(step1)s::integer, %(step_key1)s::text,
                    %(name1)s::text, %(attempt1)s::integer, %(data1)s::text),
                   (2, %(kind2)s::text, %(step2)s::integer, %(step_key2)s::text,
                    %(name2)s::text, %(attempt2)s::integer, %(data2)s::text))
     AS e(ord, kind, step, step_key, name, attempt, data)
WHERE r.id = %(run_id)s AND r.epoch = %(epoch)s AND r.state = 'running'
  AND r.lease_expires_at > %(now)s
ORDER BY e.ord
FOR NO KEY UPDATE OF r;

-- name: append_batch
-- Group commit: the appends of many attempts in one statement (one round trip, one commit).
-- Each job is fenced on its own: job_run_ids and job_epochs are the jobs' fences (job j is
-- the j-th, from 1); the entries' arrays carry their job in entry_jobs, in call order.
-- A job whose fence fails writes nothing and takes nothing from the others; the statement
-- returns the jobs whose fence held (all of whose entries were written). Fenced runs are
-- locked in id order, so two batches that share runs cannot deadlock on them.
WITH jobs AS (
    SELECT * FROM unnest(%(job_run_ids)s::text[], %(job_epochs)s::bigint[])
        WITH ORDINALITY AS j(run_id, epoch, job)
), fence AS (
    SELECT j.job, r.id, r.epoch FROM durable_runs AS r
    JOIN jobs AS j ON r.id = j.run_id AND r.epoch = j.epoch
    WHERE r.state = 'running' AND r.lease_expires_at > %(now)s
    ORDER BY r.id
    FOR NO KEY UPDATE OF r
), written AS (
    INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
    SELECT fence.id, fence.epoch, e.kind, e.step, e.step_key, e.name, e.attempt, %(now)s,
           e.data
    FROM unnest(%(entry_jobs)s::bigint[], %(kinds)s::text[], %(steps)s::integer[],
                %(step_keys)s::text[], %(names)s::text[], %(attempts)s::integer[],
                %(datas)s::text[])
         WITH ORDINALITY AS e(job, kind, step, step_key, name, attempt, data, ord)
    JOIN fence ON fence.job = e.job
    ORDER BY e.ord
)
SELECT job FROM fence;

-- name: finish_batch
-- Group commit of finish_run: many attempts' finishes in one statement, each fenced on its
-- own (a refused one changes nothing); returns the jobs that finished their run. The runs
-- are locked first, in id order (as append_batch and renew lock theirs), so two statements
-- that share runs cannot deadlock on them.
WITH /*finishes*/
SELECT run.* FROM run, notified;

-- name: finishes
-- finish_batch's finishes, its CTEs (claim_with carries them too): run is the finished runs
-- with their jobs.
jobs AS (
    SELECT * FROM unnest(%(job_run_ids)s::text[], %(job_epochs)s::bigint[],
                         %(job_states)s::text[], %(job_results)s::text[],
                         %(job_errors)s::text[])
        WITH ORDINALITY AS j(run_id, epoch, state, result, error, job)
), fence AS (
    SELECT j.job, d.id FROM durable_runs AS d
    JOIN jobs AS j ON d.id = j.run_id AND d.epoch = j.epoch
    WHERE d.state = 'running' AND d.lease_expires_at > %(now)s
    ORDER BY d.id
    FOR NO KEY UPDATE OF d
), run AS (
    UPDATE durable_runs AS d
    SET state = j.state, result = j.result, error = j.error, updated_at = %(now)s,
        worker = NULL, lease_expires_at = NULL
    FROM fence JOIN jobs AS j ON j.job = fence.job
    WHERE d.id = fence.id
    RETURNING j.job, d.*
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
    SELECT run.id, run.epoch, e.kind, e.step, e.step_key, e.name, e.attempt, %(now)s, e.data
    FROM unnest(%(entry_jobs)s::bigint[], %(kinds)s::text[], %(steps)s::integer[],
                %(step_keys)s::text[], %(names)s::text[], %(attempts)s::integer[],
                %(datas)s::text[])
         WITH ORDINALITY AS e(job, kind, step, step_key, name, attempt, data, ord)
    JOIN run ON run.job = e.job
    ORDER BY e.ord
), notified AS (
    SELECT count(pg_notify(%(done_channel)s, /*done_payload*/)) AS n FROM run
)

-- name: finish_run
WITH run AS (
    UPDATE durable_runs
    SET state = %(state)s, result = %(result)s, error = %(error)s, updated_at = %(now)s,
        worker = NULL, lease_expires_at = NULL
    WHERE id = %(run_id)s AND epoch = %(epoch)s AND state = 'running'
      AND lease_expires_at > %(now)s
    RETURNING *
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
    SELECT run.id, run.epoch, e.kind, e.step, e.step_key, e.name, e.attempt, %(now)s, e.data
    FROM run
    CROSS JOIN unnest(%(kinds)s::text[], %(steps)s::integer[], %(step_keys)s::text[],
                      %(names)s::text[], %(attempts)s::integer[], %(datas)s::text[])
         WITH ORDINALITY AS e(kind, step, step_key, name, attempt, data, ord)
    ORDER BY e.ord
), notified AS (
    SELECT count(pg_notify(%(done_channel)s, /*done_payload*/)) AS n FROM run
)
SELECT run.* FROM run, notified;

-- name: release_run
-- A run whose cancel was requested is not queued again: it ends cancelled, and its
-- run_cancelled entry follows the caller's entries.
WITH run AS (
    UPDATE durable_runs
    SET state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END,
        error = CASE WHEN cancel_requested THEN %(cancelled_error)s ELSE error END,
        worker = NULL, lease_expires_at = NULL, updated_at = %(now)s,
        -- released to wait (docs/design.md "Durable waiting"): due at %(run_at)s; waiting
        -- for a signal: due at once if one came since the attempt counted %(seen_signals)s
        -- (this row's count, re-read after a concurrent signal's lock)
        run_at = CASE WHEN %(waiting_for)s::text IS NOT NULL
                           AND signals > %(seen_signals)s::integer THEN %(now)s
                      ELSE coalesce(%(run_at)s::double precision, %(now)s) END,
        waiting_for = %(waiting_for)s::text
    WHERE id = %(run_id)s AND epoch = %(epoch)s AND state = 'running'
      AND lease_expires_at > %(now)s
    RETURNING id, epoch, state
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
    SELECT run.id, run.epoch, e.kind, e.step, e.step_key, e.name, e.attempt, %(now)s, e.data
    FROM run
    CROSS JOIN (
        SELECT * FROM unnest(%(kinds)s::text[], %(steps)s::integer[], %(step_keys)s::text[],
                             %(names)s::text[], %(attempts)s::integer[], %(datas)s::text[])
             WITH ORDINALITY AS u(kind, step, step_key, name, attempt, data, ord)
        UNION ALL
        SELECT 'run_cancelled', NULL, NULL, NULL, NULL, %(cancel_data)s, 9223372036854775807
    ) AS e
    WHERE e.ord < 9223372036854775807 OR run.state = 'cancelled'
    ORDER BY e.ord
), notified AS (
    SELECT count(pg_notify(%(done_channel)s, /*done_payload*/)) AS n
    FROM run WHERE state = 'cancelled'
)
SELECT count(*) AS done FROM run, notified;

-- name: recover_stale
-- A compare-and-set per run: the expired runs are locked with SKIP LOCKED, so a second
-- concurrent recovery skips them (or, once the first committed, no longer finds them
-- running) and recovers nothing. The run_recovered entry is written by the same statement.
-- Each recovery counts; a run with a pending cancel ends cancelled, and one recovered more
-- than %(max_recoveries)s times ends failed, naming the step its last attempt had started.
WITH stale AS (
    SELECT id, epoch, worker, lease_expires_at, heartbeat_at FROM durable_runs
    WHERE state = 'running' AND lease_expires_at <= %(now)s
      AND (%(run_id)s::text IS NULL OR (id = %(run_id)s::text AND epoch = %(epoch)s::bigint))
    FOR NO KEY UPDATE SKIP LOCKED
), last_step AS (
    SELECT DISTINCT ON (j.run_id) j.run_id, j.step, j.name
    FROM durable_journal AS j JOIN stale ON j.run_id = stale.id AND j.epoch = stale.epoch
    WHERE j.kind = 'step_started'
    ORDER BY j.run_id, j.seq DESC
), recovered AS (
    UPDATE durable_runs AS d
    SET state = CASE WHEN d.cancel_requested THEN 'cancelled'
                     WHEN d.recoveries + 1 > %(max_recoveries)s THEN 'failed'
                     ELSE 'queued' END,
        error = CASE
            WHEN d.cancel_requested THEN %(cancelled_error)s
            WHEN d.recoveries + 1 > %(max_recoveries)s THEN
                'the worker died (or froze past its lease) ' || (d.recoveries + 1)::text
                || ' times while running this run, the last time '
                || coalesce('at step ' || ls.step::text || ' (' || coalesce(ls.name, '?') || ')',
                            'when no step was running')
                || '; gave up after max_recoveries=' || %(max_recoveries)s::text
                || ' recoveries'
            ELSE d.error END,
        recoveries = d.recoveries + 1,
        worker = NULL, lease_expires_at = NULL, run_at = %(now)s, updated_at = %(now)s
    FROM stale LEFT JOIN last_step AS ls ON ls.run_id = stale.id
    WHERE d.id = stale.id AND d.state = 'running'
    RETURNING d.id, d.epoch, d.state, d.error, d.recoveries, ls.step, stale.worker,
              stale.lease_expires_at, stale.heartbeat_at
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, at, data)
    SELECT e.id, e.epoch, e.kind, %(now)s, e.data FROM (
        SELECT id, epoch, 'run_recovered' AS kind, 0 AS ord,
               json_build_object('lease_expired_at', lease_expires_at, 'worker', worker,
                                 'last_heartbeat_at', heartbeat_at)::text AS data
        FROM recovered
        UNION ALL
        SELECT id, epoch, 'run_cancelled', 1, %(cancel_data)s
        FROM recovered WHERE state = 'cancelled'
        UNION ALL
        SELECT id, epoch, 'run_failed', 1,
               json_build_object('error', error, 'error_type', 'RecoveryLimitError',
                                 'step', step, 'recoveries', recoveries)::text
        FROM recovered WHERE state = 'failed'
    ) AS e
    ORDER BY e.id, e.ord
)
SELECT id, epoch FROM recovered ORDER BY id;

-- name: journal
SELECT * FROM durable_journal WHERE run_id = %(run_id)s AND seq > %(after)s ORDER BY seq;

-- name: cancels_pending
-- The running runs with an operator cancel pending, of every worker (a worker keeps those
-- it holds): migration 010's partial index alone, so the read costs the same whatever the
-- worker holds; few entries, since a cancelled run ends within moments of the flag.
SELECT id FROM durable_runs WHERE cancel_requested AND state = 'running';

-- name: request_cancel
-- One statement: a queued run is cancelled at once, a running one is flagged. A concurrent
-- release or claim of the run is waited for and the row re-checked, so a run that is queued
-- or running is never answered "nothing to cancel".
WITH run AS (
    UPDATE durable_runs
    SET state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
        error = CASE WHEN state = 'queued' AND attempt = 0 THEN 'cancelled before it started'
                     WHEN state = 'queued' THEN 'cancelled while waiting' ELSE error END,
        cancel_requested = (state = 'running') OR cancel_requested,
        updated_at = %(now)s
    WHERE id = %(run_id)s AND state IN ('queued', 'running')
    RETURNING *
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, at, data)
    SELECT id, epoch,
           CASE WHEN state = 'cancelled' THEN 'run_cancelled' ELSE 'run_cancel_requested' END,
           %(now)s, %(data)s
    FROM run
), notified AS (
    SELECT count(pg_notify(%(done_channel)s, /*done_payload*/)) AS n
    FROM run WHERE state = 'cancelled'
)
SELECT run.* FROM run, notified;

-- name: requeue
WITH run AS (
    UPDATE durable_runs
    SET state = 'queued', run_at = %(now)s, updated_at = %(now)s, cancel_requested = false,
        result = NULL, error = NULL
    WHERE id = %(run_id)s AND state IN ('failed', 'cancelled')
    RETURNING *
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, at, data)
    SELECT id, epoch, 'run_replayed', %(now)s, %(data)s FROM run
)
SELECT * FROM run;

-- name: put_records
-- Fenced: nothing is written unless the fence holds (the caller checks "held" and rolls the
-- transaction back). Each write adds one to the record's version, under the row lock of the
-- upsert: the caller compares the returned versions with the versions it expected + 1 (a
-- compare-and-set) and rolls back on a mismatch. Records are not guarded by epochs.
WITH fence AS (
    SELECT id, epoch FROM durable_runs
    WHERE id = %(run_id)s AND epoch = %(epoch)s AND state = 'running'
      AND lease_expires_at > %(now)s
    FOR NO KEY UPDATE
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
    SELECT fence.id, fence.epoch, e.kind, e.step, e.step_key, e.name, e.attempt, %(now)s,
           e.data
    FROM fence
    CROSS JOIN unnest(%(kinds)s::text[], %(steps)s::integer[], %(step_keys)s::text[],
                      %(names)s::text[], %(attempts)s::integer[], %(datas)s::text[])
         WITH ORDINALITY AS e(kind, step, step_key, name, attempt, data, ord)
    ORDER BY e.ord
    RETURNING 1
), written AS (
    INSERT INTO durable_records (namespace, key, value, epoch, updated_at, version)
    SELECT r.namespace, r.key, r.value, fence.epoch, %(now)s, 1
    FROM fence
    CROSS JOIN unnest(%(namespaces)s::text[], %(keys)s::text[], %(values)s::text[])
         AS r(namespace, key, value)
    ON CONFLICT (namespace, key) DO UPDATE
    SET value = excluded.value, epoch = excluded.epoch, updated_at = excluded.updated_at,
        version = durable_records.version + 1
    RETURNING namespace, key, version
)
SELECT (SELECT count(*) FROM fence) AS held,
       (SELECT count(*) FROM journaled) AS entries,
       (SELECT coalesce(json_agg(json_build_array(namespace, key, version)), '[]')::text
        FROM written) AS versions;

-- name: put_records_unfenced
INSERT INTO durable_records (namespace, key, value, epoch, updated_at, version)
SELECT r.namespace, r.key, r.value, 0, %(now)s, 1
FROM unnest(%(namespaces)s::text[], %(keys)s::text[], %(values)s::text[])
     AS r(namespace, key, value)
ON CONFLICT (namespace, key) DO UPDATE
SET value = excluded.value, updated_at = excluded.updated_at,
    version = durable_records.version + 1
RETURNING namespace, key, version;

-- name: get_record
SELECT * FROM durable_records WHERE namespace = %(namespace)s AND key = %(key)s;

-- name: list_records
SELECT * FROM durable_records WHERE namespace = %(namespace)s ORDER BY key;

-- name: now
-- The time leases are judged by (Store.now()).
SELECT %(now)s AS now;

-- name: put_schedule
-- Create a schedule (fires after now), or, with %(replace)s (a declaration in code, written
-- by each worker at start), give an existing one this definition when it differs: its paused
-- flag and what it fired are kept. Nothing written: no row returned.
INSERT INTO durable_schedules AS d (name, workflow, args, cron, timezone, concurrency_key,
                                    catchup, paused, fired_through, origin, version,
                                    created_at, updated_at)
VALUES (%(name)s, %(workflow)s, %(args)s, %(cron)s, %(timezone)s, %(key)s, %(catchup)s, false,
        %(now)s, %(origin)s, 1, %(now)s, %(now)s)
ON CONFLICT (name) DO UPDATE
SET workflow = excluded.workflow, args = excluded.args, cron = excluded.cron,
    timezone = excluded.timezone, concurrency_key = excluded.concurrency_key,
    catchup = excluded.catchup, origin = excluded.origin,
    version = d.version + 1, updated_at = excluded.updated_at
WHERE %(replace)s
  AND (d.workflow, d.args, d.cron, d.timezone, d.concurrency_key, d.catchup, d.origin)
      IS DISTINCT FROM (excluded.workflow, excluded.args, excluded.cron, excluded.timezone,
                        excluded.concurrency_key, excluded.catchup, excluded.origin)
RETURNING *;

-- name: get_schedule
SELECT * FROM durable_schedules WHERE name = %(name)s;

-- name: list_schedules
SELECT * FROM durable_schedules ORDER BY name COLLATE "C";

-- name: pause_schedule
-- A resume moves the schedule past every fire up to now: fires while paused never start.
UPDATE durable_schedules
SET fired_through = CASE WHEN paused AND NOT %(paused)s THEN greatest(fired_through, %(now)s)
                         ELSE fired_through END,
    paused = %(paused)s, version = version + 1, updated_at = %(now)s
WHERE name = %(name)s
RETURNING *;

-- name: delete_schedule
DELETE FROM durable_schedules WHERE name = %(name)s RETURNING name;

-- name: fire_schedule
-- One statement: a compare-and-set on the version read moves the schedule past the fire,
-- and only then is the fire's run inserted, as insert_run does (nothing if the id exists).
-- A concurrent fire of the same schedule waits for this one's row lock, then finds another
-- version and writes nothing.
WITH fired AS (
    UPDATE durable_schedules
    SET fired_through = %(fire_at)s::double precision, version = version + 1, updated_at = %(now)s,
        last_fire_at = CASE WHEN %(run_id)s::text IS NULL THEN last_fire_at
                            ELSE %(fire_at)s END,
        last_run_id = coalesce(%(run_id)s::text, last_run_id)
    WHERE name = %(name)s AND version = %(version)s::bigint AND NOT paused
      AND fired_through < %(fire_at)s::double precision
    RETURNING name
), run AS (
    INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, epoch, attempt,
                              run_at, created_at, updated_at, timeout, start_within)
    SELECT %(run_id)s::text, %(workflow)s::text, %(args)s::text, %(key)s::text, 'queued', 0,
           0, %(run_at)s::double precision, %(now)s, %(now)s, %(timeout)s::double precision,
           %(start_within)s::double precision
    FROM fired WHERE %(run_id)s::text IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM durable_pruned_runs WHERE id = %(run_id)s::text)
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, at, data)
    SELECT id, 0, 'run_created', %(now)s, %(data)s::text FROM run
)
SELECT (SELECT count(*) FROM fired) AS fired;

-- name: prunable_runs
-- What prune would delete, for a dry run: by the index durable_runs_by_end, keyset-paged.
-- Its rows are the finished runs (partial): the IN, word for word the index's WHERE, lets
-- a generic plan (a prepared statement) read it whatever %(state)s is bound to.
SELECT * FROM durable_runs
WHERE state IN ('completed', 'failed', 'cancelled') AND state = %(state)s AND updated_at < %(cutoff)s
  AND (updated_at, id COLLATE "C") > (%(after_at)s::double precision, %(after_id)s::text)
ORDER BY updated_at, id COLLATE "C"
LIMIT %(limit)s;

-- name: prune_mark
-- A batch of prune, the first of three statements of one transaction (PostgresStore
-- .prune_runs): lock the batch's runs (a replay waits, then finds them gone) and write their
-- tombstones; then prune_journal, whose trigger lets only the entries of a finished run
-- with a tombstone of its ending go (it sees the tombstones: an earlier statement), and
-- prune_delete_runs.
WITH doomed AS (
    SELECT id, workflow, concurrency_key, state, updated_at FROM durable_runs
    WHERE state IN ('completed', 'failed', 'cancelled')  -- durable_runs_by_end (partial)
      AND state = %(state)s AND updated_at < %(cutoff)s
    ORDER BY updated_at, id COLLATE "C"
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
INSERT INTO durable_pruned_runs AS p (id, workflow, concurrency_key, state, ended_at,
                                      pruned_at)
SELECT id, workflow, concurrency_key, state, updated_at, %(now)s FROM doomed
ON CONFLICT (id) DO UPDATE
SET workflow = excluded.workflow, concurrency_key = excluded.concurrency_key,
    state = excluded.state, ended_at = excluded.ended_at, pruned_at = excluded.pruned_at
RETURNING *;

-- name: prune_journal
DELETE FROM durable_journal WHERE run_id = ANY (%(ids)s::text[]);

-- name: prune_signals
-- A pruned run's signals (durable waiting) go with its journal.
DELETE FROM durable_signals WHERE run_id = ANY (%(ids)s::text[]);

-- name: prune_delete_runs
DELETE FROM durable_runs
WHERE id = ANY (%(ids)s::text[]) AND state = %(state)s AND updated_at < %(cutoff)s;

-- name: get_pruned
SELECT * FROM durable_pruned_runs WHERE id = %(id)s;

-- name: seed_run
-- Bulk seeding of finished runs (durable/store/_seed.py: tests and benchmarks at scale).
INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, epoch, attempt, run_at,
                          created_at, updated_at)
SELECT r.id, r.workflow, '[]', r.key, r.state, 1, 1, r.created_at, r.created_at, r.ended_at
FROM unnest(%(ids)s::text[], %(workflows)s::text[], %(keys)s::text[], %(states)s::text[],
            %(created)s::double precision[], %(ended)s::double precision[])
     AS r(id, workflow, key, state, created_at, ended_at);

-- name: seed_entry
INSERT INTO durable_journal (run_id, epoch, kind, at, data)
SELECT e.run_id, e.epoch, e.kind, e.at, '{}'
FROM unnest(%(ids)s::text[], %(epochs)s::bigint[], %(kinds)s::text[],
            %(ats)s::double precision[]) AS e(run_id, epoch, kind, at);

-- name: send_signal
-- One statement: the run is locked, the signal recorded (unless its signal_id already was,
-- or the run is finished), counted on the run, a run waiting for it made due (the update
-- trigger sends NOTIFY), and the signal_sent entry journaled.
WITH run AS (
    SELECT id, epoch, state FROM durable_runs WHERE id = %(run_id)s FOR NO KEY UPDATE
), ins AS (
    INSERT INTO durable_signals (run_id, name, signal_id, payload, created_at, origin)
    SELECT id, %(name)s, %(signal_id)s, %(payload)s, %(now)s, %(origin)s FROM run
    WHERE state IN ('queued', 'running')
    ON CONFLICT (run_id, signal_id) DO NOTHING
    RETURNING seq, run_id
), woke AS (
    UPDATE durable_runs AS d
    SET signals = d.signals + 1,
        run_at = CASE WHEN d.state = 'queued' AND d.waiting_for = %(name)s::text
                      THEN least(d.run_at, %(now)s) ELSE d.run_at END
    FROM ins WHERE d.id = ins.run_id
    RETURNING d.id
), journaled AS (
    INSERT INTO durable_journal (run_id, epoch, kind, at, data)
    SELECT run.id, run.epoch, 'signal_sent', %(now)s,
           (%(data)s::jsonb || jsonb_build_object('seq', ins.seq))::text
    FROM run JOIN ins ON ins.run_id = run.id
)
SELECT run.state, (SELECT seq FROM ins) AS seq FROM run;

-- name: next_signal
-- The run's signal count and its oldest signal of a name after the last one it consumed,
-- in one snapshot.
SELECT (SELECT signals FROM durable_runs WHERE id = %(run_id)s) AS count, s.*
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT seq, name, payload, created_at, origin FROM durable_signals
    WHERE run_id = %(run_id)s AND name = %(name)s AND seq > %(after)s
    ORDER BY seq LIMIT 1) AS s ON true;

-- name: list_signals
SELECT seq, name, signal_id, payload, created_at, origin FROM durable_signals
WHERE run_id = %(run_id)s ORDER BY seq;

-- name: pause_workflow
-- Pause a workflow (docs/design.md, "Pausing a workflow"): a row, once; a second pause
-- keeps the first's time and origin (nothing is returned).
INSERT INTO durable_paused (workflow, paused_at, origin)
VALUES (%(workflow)s::text, %(now)s, %(origin)s::text)
ON CONFLICT (workflow) DO NOTHING
RETURNING *;

-- name: resume_workflow
-- The delete's statement trigger notifies the work channel (migration 014).
DELETE FROM durable_paused WHERE workflow = %(workflow)s::text RETURNING *;

-- name: paused_workflows
SELECT * FROM durable_paused ORDER BY workflow COLLATE "C";

