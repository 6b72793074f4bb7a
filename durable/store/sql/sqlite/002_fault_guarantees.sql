-- Schema version 2 (SQLite): recoveries are counted per run (bounded by max_recoveries),
-- and records carry a version for compare-and-set writes.
ALTER TABLE durable_runs ADD COLUMN recoveries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE durable_records ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
-- the first queued run of a key, in the claim's order (started runs first, then run_at,
-- then creation): an index lookup, no sort
CREATE INDEX durable_runs_queued_by_key
    ON durable_runs (concurrency_key, state, attempt = 0, run_at, created_at, id)
    WHERE concurrency_key IS NOT NULL;
