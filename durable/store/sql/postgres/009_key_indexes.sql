-- Schema version 9 (PostgreSQL): a concurrency key's runs by state and by workflow
-- (docs/list-queries.md, "A key with a long history"): a key that every run of a resource
-- shares keeps them all, and its index alone made the state or the workflow a filter on
-- each of its runs. Partial: a run without a key writes neither; a keyed run's claim and
-- finish change the first (its state), not the second. `concurrency_key = $1` implies
-- the predicate (= is strict), so a generic plan may read them too.
CREATE INDEX durable_runs_by_key_state
    ON durable_runs (concurrency_key, state, created_at, id COLLATE "C")
    WHERE concurrency_key IS NOT NULL;
CREATE INDEX durable_runs_by_key_workflow
    ON durable_runs (concurrency_key, workflow, created_at, id COLLATE "C")
    WHERE concurrency_key IS NOT NULL;
