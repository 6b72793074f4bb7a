-- Schema version 5 (SQLite): retention (docs/design.md, "Retention"). `durable prune` deletes
-- finished runs and their journals in small batches; each leaves a tombstone here, so `show`
-- and the console say "pruned on ..." instead of "no such run".
CREATE TABLE durable_pruned_runs (
    id              TEXT PRIMARY KEY,
    workflow        TEXT NOT NULL,
    concurrency_key TEXT,
    state           TEXT NOT NULL,
    ended_at        REAL NOT NULL,
    pruned_at       REAL NOT NULL
);
-- the finished runs of a state by their end (a finished run's updated_at), oldest first
CREATE INDEX durable_runs_by_end ON durable_runs (state, updated_at, id);

-- The journal stays append-only: no entry is ever changed, and an entry may be deleted only
-- when its run is finished and is being pruned (a tombstone of exactly this ending exists:
-- same id, the run's end). Every other DELETE is refused, as before.
DROP TRIGGER durable_journal_no_delete;
CREATE TRIGGER durable_journal_no_delete BEFORE DELETE ON durable_journal
WHEN NOT EXISTS (
    SELECT 1 FROM durable_pruned_runs AS p JOIN durable_runs AS r ON r.id = p.id
    WHERE p.id = OLD.run_id AND p.ended_at = r.updated_at
      AND r.state IN ('completed', 'failed', 'cancelled'))
BEGIN SELECT RAISE(ABORT, 'the durable journal is append-only: only the entries of a finished run being pruned may be deleted'); END;
