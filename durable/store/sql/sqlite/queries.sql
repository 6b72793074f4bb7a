-- Named queries of the SQLite store. Each claim and state change is one conditional statement.
-- Parameters are named (:name). A fenced statement holds only while the run is running
-- under the attempt's epoch and its lease has not expired.

-- name: insert_run
INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, epoch, attempt,
                          run_at, created_at, updated_at, timeout)
VALUES (:id, :workflow, :args, :key, 'queued', 0, 0, :run_at, :now, :now, :timeout)
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: get_run
SELECT * FROM durable_runs WHERE id = :id;

-- name: list_runs
SELECT * FROM durable_runs
WHERE (:state IS NULL OR state = :state)
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (:key IS NULL OR concurrency_key = :key)
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: latest_run
SELECT * FROM durable_runs
WHERE workflow = :workflow AND concurrency_key = :key
ORDER BY created_at DESC, id DESC
LIMIT 1;

-- name: claim
UPDATE durable_runs
SET state = 'running',
    epoch = (SELECT coalesce(max(epoch), 0) + 1 FROM durable_runs),
    attempt = attempt + 1,
    worker = :worker,
    lease_expires_at = :now + :lease,
    heartbeat_at = :now,
    updated_at = :now
WHERE +state = 'queued'  -- unary +: look the chosen ids up by primary key, not the queue
  AND id IN (
    SELECT r.id FROM durable_runs AS r
    WHERE r.state = 'queued' AND r.run_at <= :now
      AND (:run_id IS NULL OR r.id = :run_id)
      AND (:workflows IS NULL OR r.workflow IN (SELECT value FROM json_each(:workflows)))
      AND (r.concurrency_key IS NULL OR (
            NOT EXISTS (SELECT 1 FROM durable_runs AS x
                        WHERE x.concurrency_key = r.concurrency_key AND x.state = 'running')
            AND r.id = (SELECT y.id FROM durable_runs AS y
                        WHERE y.concurrency_key = r.concurrency_key
                          AND y.state = 'queued' AND y.run_at <= :now
                        ORDER BY y.run_at, y.created_at, y.id LIMIT 1)))
    ORDER BY r.run_at, r.created_at, r.id
    LIMIT :limit)
RETURNING *;

-- name: renew
UPDATE durable_runs
SET lease_expires_at = :now + :lease,
    heartbeat_at = :now,
    heartbeat_detail = coalesce(json_extract(:details, '$."' || id || '"'), heartbeat_detail)
WHERE state = 'running' AND worker = :worker AND lease_expires_at > :now
  AND (id, epoch) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                      FROM json_each(:held))
RETURNING id, epoch, cancel_requested;

-- name: append_entry
INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
SELECT :run_id, :epoch, :kind, :step, :step_key, :name, :attempt, :now, :data
WHERE EXISTS (SELECT 1 FROM durable_runs
              WHERE id = :run_id AND epoch = :epoch AND state = 'running'
                AND lease_expires_at > :now);

-- name: append_unfenced
INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, attempt, at, data)
VALUES (:run_id, :epoch, :kind, :step, :step_key, :name, :attempt, :now, :data);

-- name: finish_run
UPDATE durable_runs
SET state = :state, result = :result, error = :error, updated_at = :now,
    worker = NULL, lease_expires_at = NULL
WHERE id = :run_id AND epoch = :epoch AND state = 'running' AND lease_expires_at > :now;

-- name: release_run
UPDATE durable_runs
SET state = 'queued', worker = NULL, lease_expires_at = NULL, run_at = :now, updated_at = :now
WHERE id = :run_id AND epoch = :epoch AND state = 'running' AND lease_expires_at > :now;

-- name: journal_recovery
INSERT INTO durable_journal (run_id, epoch, kind, at, data)
SELECT id, epoch, 'run_recovered', :now,
       json_object('lease_expired_at', lease_expires_at, 'worker', worker,
                   'last_heartbeat_at', heartbeat_at)
FROM durable_runs
WHERE state = 'running' AND lease_expires_at <= :now
  AND (:run_id IS NULL OR (id = :run_id AND epoch = :epoch));

-- name: recover_stale
UPDATE durable_runs
SET state = 'queued', worker = NULL, lease_expires_at = NULL, run_at = :now, updated_at = :now
WHERE state = 'running' AND lease_expires_at <= :now
  AND (:run_id IS NULL OR (id = :run_id AND epoch = :epoch))
RETURNING id, epoch;

-- name: journal
SELECT * FROM durable_journal WHERE run_id = :run_id AND seq > :after ORDER BY seq;

-- name: cancel_queued
UPDATE durable_runs
SET state = 'cancelled', error = 'cancelled before it started', updated_at = :now
WHERE id = :run_id AND state = 'queued'
RETURNING *;

-- name: cancel_running
UPDATE durable_runs
SET cancel_requested = 1, updated_at = :now
WHERE id = :run_id AND state = 'running'
RETURNING *;

-- name: requeue
UPDATE durable_runs
SET state = 'queued', run_at = :now, updated_at = :now, cancel_requested = 0,
    result = NULL, error = NULL
WHERE id = :run_id AND state IN ('failed', 'cancelled')
RETURNING *;

-- name: put_record
INSERT INTO durable_records (namespace, key, value, epoch, updated_at)
SELECT :namespace, :key, :value, :epoch, :now
WHERE EXISTS (SELECT 1 FROM durable_runs
              WHERE id = :run_id AND epoch = :epoch AND state = 'running'
                AND lease_expires_at > :now)
ON CONFLICT (namespace, key) DO UPDATE
SET value = excluded.value, epoch = excluded.epoch, updated_at = excluded.updated_at
WHERE excluded.epoch >= durable_records.epoch;

-- name: get_record
SELECT * FROM durable_records WHERE namespace = :namespace AND key = :key;

-- name: list_records
SELECT * FROM durable_records WHERE namespace = :namespace ORDER BY key;

-- name: next_run_at
SELECT min(run_at) AS run_at FROM durable_runs WHERE state = 'queued';

-- name: put_record_unfenced
INSERT INTO durable_records (namespace, key, value, epoch, updated_at)
VALUES (:namespace, :key, :value, :epoch, :now)
ON CONFLICT (namespace, key) DO UPDATE
SET value = excluded.value, updated_at = excluded.updated_at;
