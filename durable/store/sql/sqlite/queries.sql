-- Named queries of the SQLite store. Each claim and state change is one conditional statement.
-- Parameters are named (:name). A fenced statement holds only while the run is running
-- under the attempt's epoch and its lease has not expired.

-- name: insert_run
-- An id that named a pruned run (durable_pruned_runs) is not used again: nothing is
-- inserted (the store says why).
INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, epoch, attempt,
                          run_at, created_at, updated_at, timeout, start_within)
SELECT :id, :workflow, :args, :key, 'queued', 0, 0, :run_at, :now, :now, :timeout,
       :start_within
WHERE NOT EXISTS (SELECT 1 FROM durable_pruned_runs WHERE id = :id)
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: get_run
SELECT * FROM durable_runs WHERE id = :id;

-- name: list_runs
-- The marker line below becomes the fragments runs_where_* of the filters given, joined
-- by AND (durable/store/_base.py, run_filters): one fixed statement per filter shape, never
-- (:x IS NULL OR col = :x), which SQLite cannot serve from an index.
SELECT * FROM durable_runs
/*where*/
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: list_unfinished
-- The queued and the running runs together, newest first, as list_runs pages them: one
-- statement, so one snapshot, and a run that moves between the two states meanwhile (a
-- claim, a release, a recovery) is read once, in one of them (Store.list_unfinished). Each
-- branch reads its state's range of an index in the list's order and stops at the page's
-- size; the page is the newest of the two. The two markers become the branches'
-- WHERE clauses (list_unfinished_query in durable/store/_base.py: the filters'
-- fragments, runs_where_queued / runs_where_running for the state, a literal each, so
-- one statement holds both).
SELECT * FROM (
    SELECT * FROM (SELECT * FROM durable_runs
                   /*queued*/
                   ORDER BY created_at DESC, id DESC LIMIT :limit)
    UNION ALL
    SELECT * FROM (SELECT * FROM durable_runs
                   /*running*/
                   ORDER BY created_at DESC, id DESC LIMIT :limit))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: count_runs
SELECT state, count(*) AS n FROM durable_runs
/*where*/
GROUP BY state;

-- name: runs_where_state
state = :state

-- name: runs_where_queued
state = 'queued'

-- name: runs_where_running
state = 'running'

-- name: runs_any_state
-- every state, named for a count within a time window: each state's range is then read in
-- an index led by the state (count_runs_query in durable/store/_sqlite.py)
state IN ('queued', 'running', 'completed', 'failed', 'cancelled')

-- name: runs_where_workflow
workflow = :workflow

-- name: runs_where_workflow_of_key
-- with a key given: the key's runs of the workflow (durable_runs_by_key_workflow)
workflow = :workflow

-- name: runs_where_workflow_of_key_state
-- with a key and a state given: unary + keeps SQLite on the key's runs in the state
-- (durable_runs_by_key_state: what is queued or running on a key is few runs), checking
-- the workflow on each
+workflow = :workflow

-- name: runs_where_key
concurrency_key = :key

-- name: runs_where_before
-- the keyset cursor: strictly after the previous page's last run, in the sort's order
(created_at, id) < (:before_at, :before_id)

-- name: runs_where_created_from
created_at >= :created_from

-- name: runs_where_created_to
created_at < :created_to

-- name: runs_where_id_prefix
-- a range of the primary key (binary order), so % and _ in the prefix are plain characters
id >= :id_prefix AND id < :id_prefix_end

-- name: runs_where_id_prefix_open
id >= :id_prefix

-- name: runs_where_state_checked
-- The _checked fragments: the same conditions with unary + on the column, which no index
-- serves, so the other filters' index (or the prefix's range) leads and these are tested
-- on its rows; SqliteStore.list_runs picks which by counting the prefix's ids
-- (id_prefix_rows, below; docs/list-queries.md, "An id prefix").
+state = :state

-- name: runs_where_workflow_checked
+workflow = :workflow

-- name: runs_where_workflow_of_key_checked
+workflow = :workflow

-- name: runs_where_workflow_of_key_state_checked
+workflow = :workflow

-- name: runs_where_key_checked
+concurrency_key = :key

-- name: runs_where_before_checked
(+created_at, +id) < (:before_at, :before_id)

-- name: runs_where_created_from_checked
+created_at >= :created_from

-- name: runs_where_created_to_checked
+created_at < :created_to

-- name: runs_where_id_prefix_checked
-- tested on the entries of the index that leads (each holds the id): no table row is read
-- for an id that does not match
+id >= :id_prefix AND +id < :id_prefix_end

-- name: runs_where_id_prefix_open_checked
+id >= :id_prefix

-- name: key_workflow_rows
-- How many runs of a workflow a key holds, counted up to :cap in durable_runs_by_key_workflow
-- (no table row read): with a state too, below the cap these runs lead the list (the state
-- checked on each), else the key's runs in the state do (the workflow checked).
SELECT count(*) AS n FROM (
    SELECT 1 FROM durable_runs WHERE concurrency_key = :key AND workflow = :workflow LIMIT :cap);

-- name: id_prefix_rows
-- How many ids the prefix's range holds, counted up to :cap in the primary key's index (no
-- table row read): below the cap the range leads the list, else the list's order does.
SELECT count(*) AS n FROM (SELECT 1 FROM durable_runs WHERE /*prefix*/ LIMIT :cap);

-- name: latest_run
-- the key's runs of the workflow, newest first (durable_runs_by_key_workflow)
SELECT * FROM durable_runs
WHERE workflow = :workflow AND concurrency_key = :key
ORDER BY created_at DESC, id DESC
LIMIT 1;

-- name: claim
-- The epoch is max(epoch) + 1, once per statement: every run claimed by one statement gets
-- the same token. Tokens are compared within a fencing scope (a concurrency key, or the run
-- itself), and one statement claims at most one run per key, so within every scope each
-- claim's token is above every earlier one's.
UPDATE durable_runs
SET state = 'running',
    -- epoch > 0: the partial index durable_runs_epoch (the same max: no epoch is negative)
    epoch = (SELECT coalesce(max(epoch), 0) + 1 FROM durable_runs WHERE epoch > 0),
    attempt = attempt + 1,
    worker = :worker,
    lease_expires_at = :now + :lease,
    heartbeat_at = :now,
    updated_at = :now,
    waiting_for = NULL
WHERE /*which*/
RETURNING *;

-- name: claim_which_queue
-- claim: the first :limit of the queue (or :run_id among them)
+state = 'queued'  -- unary +: look the chosen ids up by primary key, not the queue
  AND id IN (
    -- the queue (partial: queued runs only) in the claim's order, whatever the planner
    -- guesses without statistics (it would take durable_runs_by_state and sort)
    SELECT r.id FROM durable_runs AS r INDEXED BY durable_runs_queue
    WHERE /*claimable*/
      AND (:run_id IS NULL OR r.id = :run_id)
    ORDER BY r.run_at, r.created_at, r.id
    LIMIT :limit)

-- name: claim_which_run
-- claim_run: one run by its id (Store.claim_with: the run a worker read with claimable), if
-- a claim may still take it
id = (SELECT r.id FROM durable_runs AS r WHERE r.id = :run_id AND /*claimable*/)

-- name: claimable_where
-- Which queued runs a claim may take (claim, claim_run, claimable: one set of conditions).
r.state = 'queued' AND r.run_at <= :now
      AND (:workflows IS NULL OR r.workflow IN (SELECT value FROM json_each(:workflows)))
      -- not of a paused workflow (migration 014): a lookup by primary key per candidate
      AND NOT EXISTS (SELECT 1 FROM durable_paused AS p WHERE p.workflow = r.workflow)
      -- A key is held by its running run, and by a run that has started and is queued
      -- again (released or recovered): it comes first, ahead of runs that never started,
      -- which are served FIFO (run_at, then creation).
      AND (r.concurrency_key IS NULL OR (
            NOT EXISTS (SELECT 1 FROM durable_runs AS x
                        WHERE x.concurrency_key = r.concurrency_key AND x.state = 'running')
            AND r.id = (SELECT y.id FROM durable_runs AS y
                        WHERE y.concurrency_key = r.concurrency_key AND y.state = 'queued'
                        ORDER BY y.attempt = 0, y.run_at, y.created_at, y.id LIMIT 1)))

-- name: claimable
-- What claim would take now, by a read (no write, no lock).
SELECT r.* FROM durable_runs AS r INDEXED BY durable_runs_queue
WHERE /*claimable*/
ORDER BY r.run_at, r.created_at, r.id
LIMIT :limit;

-- name: renew
UPDATE durable_runs
SET lease_expires_at = :now + :lease,
    heartbeat_at = :now,
    -- ids are data: looked up as json_each keys, never spliced into a JSON path
    heartbeat_detail = coalesce((SELECT d.value FROM json_each(:details) AS d WHERE d.key = id),
                                heartbeat_detail)
WHERE state = 'running' AND worker = :worker AND lease_expires_at > :now
  AND (id, epoch) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                      FROM json_each(:held))
RETURNING id, epoch, cancel_requested;

-- name: append_entries
-- An append's entries in one fenced statement (a step's deferred completion and the next
-- step's start are two): the fence, an uncorrelated EXISTS, is checked once per statement,
-- and the rows come from a VALUES list, inserted in its order (a co-routine scan). Positional
-- parameters: ?1 the run's id, ?2 its epoch, ?3 now; /*rows*/ is one
-- (kind, step, step_key, name, attempt, data) tuple of parameters per entry, from ?4 on
-- (durable/store/_sqlite.py, _append_sql). The row count is the entries' count, or 0.
INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
SELECT ?1, ?2, entry.column1, entry.column2, entry.column3, entry.column4, entry.column5,
       ?3, entry.column6
FROM (VALUES /*rows*/) AS entry
WHERE EXISTS (SELECT 1 FROM durable_runs
              WHERE id = ?1 AND epoch = ?2 AND state = 'running'
                AND lease_expires_at > ?3);

-- name: append_unfenced
INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
VALUES (:run_id, :epoch, :kind, :step, :step_key, :name, :attempt, :now, :data);

-- name: finish_run
UPDATE durable_runs
SET state = :state, result = :result, error = :error, updated_at = :now,
    worker = NULL, lease_expires_at = NULL
WHERE id = :run_id AND epoch = :epoch AND state = 'running' AND lease_expires_at > :now;

-- name: release_run
-- A run whose cancel was requested is not queued again: it ends cancelled. A run released
-- to wait (:run_at, docs/design.md "Durable waiting") is due then; one waiting for a signal
-- (:waiting_for) is due at once if a signal came since its attempt looked (:seen_signals).
UPDATE durable_runs
SET state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END,
    error = CASE WHEN cancel_requested THEN :cancelled_error ELSE error END,
    worker = NULL, lease_expires_at = NULL, updated_at = :now,
    run_at = CASE WHEN :waiting_for IS NOT NULL AND signals > :seen_signals THEN :now
                  ELSE coalesce(:run_at, :now) END,
    waiting_for = :waiting_for
WHERE id = :run_id AND epoch = :epoch AND state = 'running' AND lease_expires_at > :now
RETURNING id, epoch, state, error;

-- name: journal_recovery
INSERT INTO durable_journal (run_id, epoch, kind, at, data)
SELECT id, epoch, 'run_recovered', :now,
       json_object('lease_expired_at', lease_expires_at, 'worker', worker,
                   'last_heartbeat_at', heartbeat_at)
FROM durable_runs
WHERE state = 'running' AND lease_expires_at <= :now
  AND (:run_id IS NULL OR (id = :run_id AND epoch = :epoch));

-- name: recover
-- The one recovery of a run whose attempt is over (recover_stale, recover_dead: the
-- recover_which_* fragment says which runs: stale, those whose lease expired, one of them
-- with :run_id and :epoch; dead, one run of a dead worker by (id, epoch, same worker),
-- regardless of the lease, since the dead process can write nothing). Requeue, unless a
-- cancel is pending (then cancelled) or the run has now been recovered more than
-- :max_recoveries times (then failed, naming the step its last attempt started).
UPDATE durable_runs
SET state = CASE WHEN cancel_requested THEN 'cancelled'
                 WHEN recoveries + 1 > :max_recoveries THEN 'failed'
                 ELSE 'queued' END,
    error = CASE
        WHEN cancel_requested THEN :cancelled_error
        WHEN recoveries + 1 > :max_recoveries THEN
            'the worker died (or froze past its lease) ' || (recoveries + 1)
            || ' times while running this run, the last time '
            || coalesce((SELECT 'at step ' || j.step || ' (' || coalesce(j.name, '?') || ')'
                         FROM durable_journal AS j
                         WHERE j.run_id = durable_runs.id AND j.epoch = durable_runs.epoch
                           AND j.kind = 'step_started'
                         ORDER BY j.seq DESC LIMIT 1),
                        'when no step was running')
            || '; gave up after max_recoveries=' || :max_recoveries || ' recoveries'
        ELSE error END,
    recoveries = recoveries + 1,
    worker = NULL, lease_expires_at = NULL, run_at = :now, updated_at = :now
WHERE state = 'running' AND /*which*/
RETURNING id, epoch, state, error, recoveries,
    (SELECT j.step FROM durable_journal AS j
     WHERE j.run_id = durable_runs.id AND j.epoch = durable_runs.epoch
       AND j.kind = 'step_started' ORDER BY j.seq DESC LIMIT 1) AS step;


-- name: recover_which_stale
lease_expires_at <= :now AND (:run_id IS NULL OR (id = :run_id AND epoch = :epoch))

-- name: recover_which_dead
id = :run_id AND epoch = :epoch AND worker = :worker
-- name: journal
SELECT * FROM durable_journal WHERE run_id = :run_id AND seq > :after ORDER BY seq;

-- name: cancels_pending
-- The running runs with an operator cancel pending, of every worker (a worker keeps those
-- it holds): migration 010's partial index alone, so the read costs the same whatever the
-- worker holds; few entries, since a cancelled run ends within moments of the flag.
-- Named: without statistics SQLite takes durable_runs_by_state (state=?) for an equality
-- over the index that holds every running run (a worker's statement: it migrated first).
SELECT id FROM durable_runs INDEXED BY durable_runs_cancel_pending
WHERE cancel_requested AND state = 'running';

-- name: request_cancel
-- One statement: a queued run is cancelled at once, a running one is flagged.
UPDATE durable_runs
SET state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
    error = CASE WHEN state = 'queued' AND attempt = 0 THEN 'cancelled before it started'
                 WHEN state = 'queued' THEN 'cancelled while waiting' ELSE error END,
    cancel_requested = CASE WHEN state = 'running' THEN 1 ELSE cancel_requested END,
    updated_at = :now
WHERE id = :run_id AND state IN ('queued', 'running')
RETURNING *;

-- name: requeue
UPDATE durable_runs
SET state = 'queued', run_at = :now, updated_at = :now, cancel_requested = 0,
    result = NULL, error = NULL
WHERE id = :run_id AND state IN ('failed', 'cancelled')
RETURNING *;

-- name: put_record
-- The fence is checked once per call (fence_holds); a record's version counts its writes.
-- Tokens are compared within a fencing scope only, so a record is not guarded by epochs:
-- a write conditioned on what the run read uses the version (record_version).
INSERT INTO durable_records (namespace, key, value, epoch, updated_at, version)
VALUES (:namespace, :key, :value, :epoch, :now, 1)
ON CONFLICT (namespace, key) DO UPDATE
SET value = excluded.value, epoch = excluded.epoch, updated_at = excluded.updated_at,
    version = durable_records.version + 1;

-- name: fence_holds
SELECT 1 FROM durable_runs
WHERE id = :run_id AND epoch = :epoch AND state = 'running' AND lease_expires_at > :now;

-- name: record_version
SELECT version FROM durable_records WHERE namespace = :namespace AND key = :key;

-- name: get_record
SELECT * FROM durable_records WHERE namespace = :namespace AND key = :key;

-- name: list_records
SELECT * FROM durable_records WHERE namespace = :namespace ORDER BY key;

-- name: next_run_at
SELECT min(run_at) AS run_at FROM durable_runs INDEXED BY durable_runs_queue
WHERE state = 'queued';

-- name: next_due
-- Seconds until the earliest queued run of the worker's workflows that is not due yet (a
-- delayed start, a released wait, a retry delay): the worker wakes then (Store.next_due_in).
-- The queue index's range after now, in its order: the first row that matches.
SELECT r.run_at - :now AS due_in FROM durable_runs AS r INDEXED BY durable_runs_queue
WHERE r.state = 'queued' AND r.run_at > :now
  AND (:workflows IS NULL OR r.workflow IN (SELECT value FROM json_each(:workflows)))
ORDER BY r.run_at
LIMIT 1;

-- name: queue_stats
-- The due queued runs per workflow, for metrics (durable/prometheus.py): a range of the
-- queue index (run_at, ...) WHERE state = 'queued'.
SELECT workflow, count(*) AS n, :now - min(run_at) AS age
FROM durable_runs INDEXED BY durable_runs_queue
WHERE state = 'queued' AND run_at <= :now
GROUP BY workflow;

-- name: put_record_unfenced
INSERT INTO durable_records (namespace, key, value, epoch, updated_at, version)
VALUES (:namespace, :key, :value, :epoch, :now, 1)
ON CONFLICT (namespace, key) DO UPDATE
SET value = excluded.value, updated_at = excluded.updated_at,
    version = durable_records.version + 1;

-- name: clock_read
-- The host clock's boot id and anchor (durable/_clock.py, BootClock), stored once per boot.
SELECT key, value FROM durable_meta WHERE key IN ('clock_boot_id', 'clock_anchor');

-- name: clock_store
INSERT INTO durable_meta (key, value) VALUES (:key, :value)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: expire_leases_of_another_boot
-- The first open of a new boot: every running lease belonged to a process of the previous
-- boot, dead with it (one machine). Expired as of now; recovery requeues them as usual.
UPDATE durable_runs SET lease_expires_at = :now
WHERE state = 'running' AND lease_expires_at > :now;

-- name: running_workers
-- The workers of the running runs (liveness, durable/_liveness.py): a read, by the state index.
SELECT id, epoch, worker FROM durable_runs WHERE state = 'running' AND worker IS NOT NULL;

-- name: any_expired
-- Whether recover_stale would find anything: a read, so an idle sweep takes no write lock.
SELECT 1 FROM durable_runs WHERE state = 'running' AND lease_expires_at <= :now LIMIT 1;

-- name: journal_death
-- A run whose worker process is dead for sure (its lock could be taken), whatever its lease.
INSERT INTO durable_journal (run_id, epoch, kind, at, data)
SELECT id, epoch, 'run_recovered', :now,
       json_object('worker_died', json('true'), 'worker', worker,
                   'lease_expires_at', lease_expires_at, 'last_heartbeat_at', heartbeat_at)
FROM durable_runs
WHERE id = :run_id AND epoch = :epoch AND state = 'running' AND worker = :worker;

-- name: put_schedule
-- Create a schedule (fires after now), or, with :replace (a declaration in code, written by
-- each worker at start), give an existing one this definition when it differs: its paused
-- flag and what it fired are kept. Nothing written: no row returned.
INSERT INTO durable_schedules (name, workflow, args, cron, timezone, concurrency_key, catchup,
                               paused, fired_through, origin, version, created_at, updated_at)
VALUES (:name, :workflow, :args, :cron, :timezone, :key, :catchup, 0, :now, :origin, 1, :now,
        :now)
ON CONFLICT (name) DO UPDATE
SET workflow = excluded.workflow, args = excluded.args, cron = excluded.cron,
    timezone = excluded.timezone, concurrency_key = excluded.concurrency_key,
    catchup = excluded.catchup, origin = excluded.origin,
    version = durable_schedules.version + 1, updated_at = excluded.updated_at
WHERE :replace
  AND (durable_schedules.workflow, durable_schedules.args, durable_schedules.cron,
       durable_schedules.timezone, durable_schedules.concurrency_key,
       durable_schedules.catchup, durable_schedules.origin)
      IS NOT (excluded.workflow, excluded.args, excluded.cron, excluded.timezone,
              excluded.concurrency_key, excluded.catchup, excluded.origin)
RETURNING *;

-- name: get_schedule
SELECT * FROM durable_schedules WHERE name = :name;

-- name: list_schedules
SELECT * FROM durable_schedules ORDER BY name;

-- name: pause_schedule
-- A resume moves the schedule past every fire up to now: fires while paused never start.
UPDATE durable_schedules
SET fired_through = CASE WHEN paused AND NOT :paused THEN max(fired_through, :now)
                         ELSE fired_through END,
    paused = :paused, version = version + 1, updated_at = :now
WHERE name = :name
RETURNING *;

-- name: delete_schedule
DELETE FROM durable_schedules WHERE name = :name;

-- name: fire_schedule
-- A compare-and-set on the version read: the fire's run is inserted in the same
-- transaction only when this moved the schedule (insert_run: nothing if the id exists).
UPDATE durable_schedules
SET fired_through = :fire_at, version = version + 1, updated_at = :now,
    last_fire_at = CASE WHEN :run_id IS NULL THEN last_fire_at ELSE :fire_at END,
    last_run_id = coalesce(:run_id, last_run_id)
WHERE name = :name AND version = :version AND NOT paused AND fired_through < :fire_at;

-- name: prunable_runs
-- What prune would delete, for a dry run: by the index durable_runs_by_end, keyset-paged.
-- Its rows are the finished runs (partial): the IN, word for word the index's WHERE, lets
-- the planner read it whatever :state is bound to.
SELECT * FROM durable_runs
WHERE state IN ('completed', 'failed', 'cancelled')
  AND state = :state AND updated_at < :cutoff AND (updated_at, id) > (:after_at, :after_id)
ORDER BY updated_at, id
LIMIT :limit;

-- name: prune_mark
-- A batch of prune: the tombstones first (the journal's trigger lets only the entries of a
-- finished run with a tombstone of its ending go), then its journal, then the runs. One
-- transaction (SqliteStore.prune_runs).
INSERT INTO durable_pruned_runs (id, workflow, concurrency_key, state, ended_at, pruned_at)
SELECT id, workflow, concurrency_key, state, updated_at, :now FROM durable_runs
WHERE state IN ('completed', 'failed', 'cancelled')  -- durable_runs_by_end (prunable_runs)
  AND state = :state AND updated_at < :cutoff
ORDER BY updated_at, id
LIMIT :limit
ON CONFLICT (id) DO UPDATE
SET workflow = excluded.workflow, concurrency_key = excluded.concurrency_key,
    state = excluded.state, ended_at = excluded.ended_at, pruned_at = excluded.pruned_at
RETURNING *;

-- name: prune_journal
DELETE FROM durable_journal WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: prune_signals
-- A pruned run's signals (durable waiting) go with its journal.
DELETE FROM durable_signals WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: prune_delete_runs
-- by the primary key (unary +: not by walking every prunable run of the state)
DELETE FROM durable_runs
WHERE id IN (SELECT value FROM json_each(:ids)) AND +state = :state AND +updated_at < :cutoff;

-- name: get_pruned
SELECT * FROM durable_pruned_runs WHERE id = :id;

-- name: seed_run
-- Bulk seeding of finished runs (durable/store/_seed.py: tests and benchmarks at scale).
INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, epoch, attempt, run_at,
                          created_at, updated_at)
VALUES (:id, :workflow, '[]', :key, :state, 1, 1, :created_at, :created_at, :ended_at);

-- name: seed_entry
INSERT INTO durable_journal (run_id, epoch, kind, at, data)
VALUES (:id, :epoch, :kind, :at, '{}');

-- name: signal_run
-- The run a signal is sent to (its state decides whether the signal is recorded).
SELECT id, epoch, state FROM durable_runs WHERE id = :run_id;

-- name: insert_signal
-- Idempotent by (run_id, signal_id); a NULL signal_id is never a duplicate.
INSERT INTO durable_signals (run_id, name, signal_id, payload, created_at, origin)
VALUES (:run_id, :name, :signal_id, :payload, :now, :origin)
ON CONFLICT (run_id, signal_id) DO NOTHING
RETURNING seq;

-- name: signal_wakes
-- Counted on the run (a release compares the count); a run waiting for this signal is due.
UPDATE durable_runs
SET signals = signals + 1,
    run_at = CASE WHEN state = 'queued' AND waiting_for = :name THEN min(run_at, :now)
                  ELSE run_at END
WHERE id = :run_id;

-- name: signal_count
SELECT signals FROM durable_runs WHERE id = :run_id;

-- name: next_signal
-- The oldest signal of a name after the last one the run consumed (delivered in order).
SELECT seq, name, payload, created_at, origin FROM durable_signals
WHERE run_id = :run_id AND name = :name AND seq > :after
ORDER BY seq LIMIT 1;

-- name: list_signals
SELECT seq, name, signal_id, payload, created_at, origin FROM durable_signals
WHERE run_id = :run_id ORDER BY seq;

-- name: pause_workflow
-- Pause a workflow (docs/design.md, "Pausing a workflow"): a row, once; a second pause
-- keeps the first's time and origin (nothing is returned).
INSERT INTO durable_paused (workflow, paused_at, origin) VALUES (:workflow, :now, :origin)
ON CONFLICT (workflow) DO NOTHING
RETURNING *;

-- name: resume_workflow
DELETE FROM durable_paused WHERE workflow = :workflow RETURNING *;

-- name: paused_workflows
SELECT * FROM durable_paused ORDER BY workflow;

