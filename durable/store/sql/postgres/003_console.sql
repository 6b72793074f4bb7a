-- Schema version 3 (PostgreSQL): the runs list of the console and `durable list`, newest
-- first by (created_at, id), filtered by any of state, workflow and concurrency key, paged by
-- a keyset cursor on (created_at, id). Each filter shape can read one index in the order of
-- the sort (docs/list-queries.md). Ids are ordered and matched by prefix in code point order
-- (COLLATE "C", as SQLite does), whatever the database's collation.
DROP INDEX durable_runs_by_created;
CREATE INDEX durable_runs_newest ON durable_runs (created_at, id COLLATE "C");
CREATE INDEX durable_runs_by_state ON durable_runs (state, created_at, id COLLATE "C");
CREATE INDEX durable_runs_by_workflow ON durable_runs (workflow, created_at, id COLLATE "C");
CREATE INDEX durable_runs_by_workflow_state
    ON durable_runs (workflow, state, created_at, id COLLATE "C");
CREATE INDEX durable_runs_by_concurrency_key
    ON durable_runs (concurrency_key, created_at, id COLLATE "C");
-- latest_run (a workflow's newest run of a key): in the order of the sort, id included
DROP INDEX durable_runs_by_key;
CREATE INDEX durable_runs_by_key
    ON durable_runs (workflow, concurrency_key, created_at, id COLLATE "C");
-- an id prefix as a range in code point order (the primary key's order is the collation's)
CREATE INDEX durable_runs_id_c ON durable_runs (id COLLATE "C");
