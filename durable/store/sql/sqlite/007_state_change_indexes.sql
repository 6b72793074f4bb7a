-- Schema version 7 (SQLite): what a state change writes (issue 10, target 5). Every claim
-- and finish updates the run's row and each index whose columns change; these indexes
-- hold only the rows their queries read (docs/list-queries.md, "Indexes"):
-- the claim's queue holds the queued runs only (a claim deletes one entry, a finish
-- touches nothing); it is read with state = 'queued' (claim, claimable, next_run_at,
-- queue_stats)
DROP INDEX durable_runs_queue;
CREATE INDEX durable_runs_queue ON durable_runs (run_at, created_at, id) WHERE state = 'queued';
-- the first queued run of a key: the queued runs of a key only
DROP INDEX durable_runs_queued_by_key;
CREATE INDEX durable_runs_queued_by_key
    ON durable_runs (concurrency_key, attempt = 0, run_at, created_at, id)
    WHERE state = 'queued' AND concurrency_key IS NOT NULL;
-- retention's finished runs by their end: the finished runs only (a claim touches
-- nothing; the prune statements say state IN (...) so the planner may read it)
DROP INDEX durable_runs_by_end;
CREATE INDEX durable_runs_by_end ON durable_runs (state, updated_at, id)
    WHERE state IN ('completed', 'failed', 'cancelled');
-- latest_run reads the key's index (durable_runs_by_concurrency_key), as the list's
-- workflow+key shape does: a key has few runs
DROP INDEX durable_runs_by_key;
-- the epoch, so max(epoch) + 1 is an index lookup: the claimed runs only (a first claim
-- inserts one entry at the index's end instead of also deleting its run's epoch 0 among
-- every never-claimed run's); the claim's max reads it with epoch > 0
DROP INDEX durable_runs_epoch;
CREATE INDEX durable_runs_epoch ON durable_runs (epoch) WHERE epoch > 0;
