-- Schema version 7 (PostgreSQL): what a state change writes (issue 10, target 5). Every
-- claim and finish updates the run's row and each index whose columns change; these
-- indexes hold only the rows their queries read (docs/list-queries.md, "Indexes").
-- retention's finished runs by their end: the finished runs only (a claim touches
-- nothing; the prune statements say state IN (...) so the planner may read it)
DROP INDEX durable_runs_by_end;
CREATE INDEX durable_runs_by_end ON durable_runs (state, updated_at, id COLLATE "C")
    WHERE state IN ('completed', 'failed', 'cancelled');
-- latest_run reads the key's index (durable_runs_by_concurrency_key), as the list's
-- workflow+key shape does: a key has few runs
DROP INDEX durable_runs_by_key;
