-- Schema version 3 (SQLite): the runs list of the console and `durable list`, newest first
-- by (created_at, id), filtered by any of state, workflow and concurrency key, paged by a
-- keyset cursor on (created_at, id). Each filter shape reads one index in the order of the
-- sort (docs/list-queries.md); a prefix of the id is a range of the primary key.
DROP INDEX durable_runs_by_created;
CREATE INDEX durable_runs_newest ON durable_runs (created_at, id);
CREATE INDEX durable_runs_by_state ON durable_runs (state, created_at, id);
CREATE INDEX durable_runs_by_workflow ON durable_runs (workflow, created_at, id);
-- a workflow's runs in one state; and its counts per state, from the index alone
CREATE INDEX durable_runs_by_workflow_state ON durable_runs (workflow, state, created_at, id);
CREATE INDEX durable_runs_by_concurrency_key ON durable_runs (concurrency_key, created_at, id);
-- latest_run (a workflow's newest run of a key): in the order of the sort, id included
DROP INDEX durable_runs_by_key;
CREATE INDEX durable_runs_by_key ON durable_runs (workflow, concurrency_key, created_at, id);
