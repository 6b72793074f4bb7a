-- Schema version 2 (PostgreSQL): recoveries are counted per run (bounded by
-- max_recoveries), and records carry a version for compare-and-set writes.
ALTER TABLE durable_runs ADD COLUMN recoveries integer NOT NULL DEFAULT 0;
ALTER TABLE durable_records ADD COLUMN version bigint NOT NULL DEFAULT 1;
-- Fencing tokens are compared within a scope (the concurrency key, or the run): the
-- sequence gives every claim a value above every earlier claim's, so they increase
-- strictly within every scope.
COMMENT ON SEQUENCE durable_epochs IS
    'fencing tokens: strictly increasing within a run''s concurrency key (or the run)';
-- The first queued run of a key, in the claim's order (started runs first, then run_at,
-- then creation): an index lookup, no sort.
DROP INDEX durable_runs_queued_by_key;
CREATE INDEX durable_runs_queued_by_key
    ON durable_runs (concurrency_key, (attempt = 0), run_at, created_at, id)
    WHERE state = 'queued' AND concurrency_key IS NOT NULL;
