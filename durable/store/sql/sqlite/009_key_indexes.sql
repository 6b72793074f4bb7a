-- Schema version 9 (SQLite): a concurrency key's runs by state and by workflow
-- (docs/list-queries.md, "A key with a long history"). 007 read a key's runs through
-- durable_runs_by_concurrency_key alone and checked the state or workflow on each run,
-- assuming a key has few runs; a key that every run of a resource shares keeps them all
-- (33,000 of 100,000: what is queued on it, 3 runs, took 18 ms; a workflow's newest run
-- on it, 11 ms). Partial: a run without a key writes neither; a keyed run's claim and
-- finish move its entry in the first (its state changes), not in the second.
CREATE INDEX durable_runs_by_key_state ON durable_runs (concurrency_key, state, created_at, id)
    WHERE concurrency_key IS NOT NULL;
CREATE INDEX durable_runs_by_key_workflow
    ON durable_runs (concurrency_key, workflow, created_at, id)
    WHERE concurrency_key IS NOT NULL;
